import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { InvalidMessageError } from '../errors.ts';
import { HEX64, sha256, type WeightEntry } from '../p2p/index.ts';
import { type Tensor, tensor } from '../tensor/index.ts';

/**
 * A worker's content-addressed store of weight chunks: in memory while a load is under way,
 * and on disk when the worker has a data directory, so that a load broken off resumes where
 * it stopped and a worker that already holds a checkpoint's chunks (from an earlier job, or
 * before a restart) is sent nothing.
 */
export class ChunkStore {
  private readonly memory = new Map<string, Uint8Array>();

  constructor(private readonly dir: string | null = null) {
    if (dir) mkdirSync(dir, { recursive: true });
  }

  has(sha: string): boolean {
    return this.memory.has(sha) || (this.dir !== null && existsSync(join(this.dir, sha)));
  }

  /** Stores a chunk after checking that its bytes have the hash it claims. */
  put(sha: string, bytes: Uint8Array): void {
    if (!HEX64.test(sha) || sha256(bytes) !== sha) throw new InvalidMessageError(`a chunk does not match its hash ${sha.slice(0, 12)}…`);
    if (this.dir) {
      const tmp = join(this.dir, `${sha}.part`);
      writeFileSync(tmp, bytes);
      renameSync(tmp, join(this.dir, sha));
    } else {
      this.memory.set(sha, new Uint8Array(bytes)); // a copy (Buffer.slice would keep the whole receive buffer alive)
    }
  }

  get(sha: string): Uint8Array {
    const m = this.memory.get(sha);
    if (m) return m;
    if (this.dir && existsSync(join(this.dir, sha))) {
      const bytes = readFileSync(join(this.dir, sha));
      if (sha256(bytes) === sha) return bytes;
    }
    throw new InvalidMessageError(`chunk ${sha.slice(0, 12)}… has not arrived`);
  }

  /** The chunks of `entries` this store lacks. */
  missing(entries: readonly WeightEntry[]): string[] {
    return [...new Set(entries.flatMap((e) => e.chunks))].filter((sha) => !this.has(sha));
  }

  /** Builds a weight from its chunks. */
  assemble(entry: WeightEntry): Tensor {
    const size = entry.shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(size);
    const bytes = new Uint8Array(data.buffer);
    let offset = 0;
    for (const sha of entry.chunks) {
      const chunk = this.get(sha);
      if (offset + chunk.length > bytes.length) throw new InvalidMessageError(`the chunks of '${entry.name}' are larger than its shape [${entry.shape}]`);
      bytes.set(chunk, offset);
      offset += chunk.length;
    }
    if (offset !== bytes.length) throw new InvalidMessageError(`the chunks of '${entry.name}' hold ${offset} bytes, its shape needs ${bytes.length}`);
    return tensor(data, entry.shape);
  }

  /** Drops the in-memory copies of chunks (after a load: on disk they stay). */
  release(shas: Iterable<string>): void {
    for (const sha of shas) this.memory.delete(sha);
  }

  /** Chunks held in memory. */
  get size(): number {
    return this.memory.size;
  }
}
