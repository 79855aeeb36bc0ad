import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { InvalidMessageError } from '../errors.ts';
import { HEX64, sha256 } from '../p2p/index.ts';

/**
 * A worker's content-addressed store of the weight chunks it received, on disk in its data
 * directory, so that a load broken off resumes where it stopped and a worker that already
 * holds a checkpoint's chunks (from an earlier job, or before a restart) is sent nothing.
 * Without a data directory it keeps nothing: arriving chunks go straight into the section.
 */
export class ChunkStore {
  constructor(private readonly dir: string | null = null) {
    if (dir) mkdirSync(dir, { recursive: true });
  }

  has(sha: string): boolean {
    return this.dir !== null && HEX64.test(sha) && existsSync(join(this.dir, sha));
  }

  /** Keeps a chunk (when the store has a directory) after checking that its bytes have the hash it claims. */
  put(sha: string, bytes: Uint8Array): void {
    if (!HEX64.test(sha) || sha256(bytes) !== sha) throw new InvalidMessageError(`a chunk does not match its hash ${sha.slice(0, 12)}…`);
    if (!this.dir) return;
    const tmp = join(this.dir, `${sha}.part`);
    writeFileSync(tmp, bytes);
    renameSync(tmp, join(this.dir, sha));
  }

  /** A chunk it holds, checked against its hash again (a file damaged on disk is not used); null if it has none. */
  get(sha: string): Uint8Array | null {
    if (!this.has(sha)) return null;
    const bytes = readFileSync(join(this.dir!, sha));
    return sha256(bytes) === sha ? bytes : null;
  }
}
