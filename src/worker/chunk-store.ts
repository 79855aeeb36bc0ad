import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { InvalidArgumentError, InvalidMessageError } from '../errors.ts';
import { HEX64, sha256 } from '../p2p/index.ts';

/** What a store under `--data` keeps at most by default (`worker --store-max`). */
export const STORE_MAX_BYTES = 20 * 2 ** 30;

/**
 * A worker's content-addressed store of the weight chunks it received, on disk in its data
 * directory, so that a load broken off resumes where it stopped and a worker that already
 * holds a checkpoint's chunks (from an earlier job, or before a restart) is sent nothing.
 * Without a data directory it keeps nothing: arriving chunks go straight into the section.
 * It keeps at most `maxBytes`: past them the chunks least recently put or read go first (a
 * chunk is only a copy: one gone is sent again when a load needs it).
 */
export class ChunkStore {
  /** Each chunk it holds and its size, least recently used first (a Map keeps insertion order). */
  private readonly chunks = new Map<string, number>();
  private held = 0;
  /** Chunks let go to stay within the cap, since it opened. */
  evicted = 0;

  constructor(
    private readonly dir: string | null = null,
    readonly maxBytes = STORE_MAX_BYTES,
  ) {
    if (!Number.isFinite(maxBytes) || maxBytes < 0) throw new InvalidArgumentError(`a chunk store's cap must be a size in bytes, not ${maxBytes}`);
    if (!dir) return;
    mkdirSync(dir, { recursive: true });
    // what an earlier run left, oldest first (by the time each was last written or read)
    const found = readdirSync(dir).filter((name) => HEX64.test(name)).map((name) => {
      const s = statSync(join(dir, name));
      return { name, bytes: s.size, at: s.mtimeMs };
    });
    found.sort((a, b) => a.at - b.at);
    for (const f of found) this.track(f.name, f.bytes);
    this.trim();
  }

  /** Bytes of the chunks it holds. */
  get bytes(): number {
    return this.held;
  }

  has(sha: string): boolean {
    return this.dir !== null && this.chunks.has(sha) && existsSync(join(this.dir, sha));
  }

  /** Keeps a chunk (when the store has a directory) after checking that its bytes have the hash it claims. */
  put(sha: string, bytes: Uint8Array): void {
    if (!HEX64.test(sha) || sha256(bytes) !== sha) throw new InvalidMessageError(`a chunk does not match its hash ${sha.slice(0, 12)}…`);
    if (!this.dir || bytes.byteLength > this.maxBytes) return;
    const tmp = join(this.dir, `${sha}.part`);
    writeFileSync(tmp, bytes);
    renameSync(tmp, join(this.dir, sha));
    this.track(sha, bytes.byteLength);
    this.trim();
  }

  /** A chunk it holds, checked against its hash again (a file damaged on disk is not used); null if it has none. */
  get(sha: string): Uint8Array | null {
    if (!this.has(sha)) return null;
    const bytes = readFileSync(join(this.dir!, sha));
    if (sha256(bytes) !== sha) return null;
    this.track(sha, bytes.byteLength);
    // its file's time too: a worker started again lets go of what was used longest ago first
    const now = new Date();
    utimesSync(join(this.dir!, sha), now, now);
    return bytes;
  }

  /** Marks a chunk the most recently used (counting it once). */
  private track(sha: string, bytes: number): void {
    this.held += bytes - (this.chunks.get(sha) ?? 0);
    this.chunks.delete(sha);
    this.chunks.set(sha, bytes);
  }

  /** Lets go of the least recently used chunks until it holds at most its cap. */
  private trim(): void {
    for (const [sha, bytes] of this.chunks) {
      if (this.held <= this.maxBytes) break;
      rmSync(join(this.dir!, sha), { force: true });
      this.chunks.delete(sha);
      this.held -= bytes;
      this.evicted++;
    }
  }
}
