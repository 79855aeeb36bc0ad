import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { CheckpointWeights } from '../models/index.ts';
import { CHUNK_BYTES, type Logger, sha256 } from '../p2p/index.ts';

/** Where one chunk of a checkpoint the worker holds lies. */
interface Place {
  weights: CheckpointWeights;
  name: string;
  index: number;
}

/**
 * The checkpoints a worker holds on its own disk (`--models DIR`: Hugging Face directories,
 * DIR itself or its subdirectories), indexed by the sha256 of every weight chunk. The hashes
 * are computed once and cached; a load whose manifest lists chunks found here reads them from
 * the file and receives nothing over the network.
 */
export class ModelIndex {
  private readonly places = new Map<string, Place>();
  private readonly opened: CheckpointWeights[] = [];

  private constructor() {}

  /** Indexes every checkpoint under `dir`; `cacheDir` keeps the hashes (null: hash again next start). */
  static async build(dir: string, cacheDir: string | null, log?: Logger): Promise<ModelIndex> {
    const index = new ModelIndex();
    if (!existsSync(dir) || !statSync(dir).isDirectory()) return index;
    const candidates = [dir, ...readdirSync(dir).map((d) => join(dir, d)).filter((d) => statSync(d).isDirectory())];
    for (const candidate of candidates.filter((d) => existsSync(join(d, 'config.json')))) {
      let weights: CheckpointWeights;
      try {
        weights = CheckpointWeights.open(candidate, { chunkBytes: CHUNK_BYTES, cacheDir });
      } catch (err) {
        log?.warn('model-skipped', { dir: candidate, error: (err as Error).message });
        continue;
      }
      index.opened.push(weights);
      let chunks = 0;
      for (const name of weights.names()) {
        let hashes: string[];
        try {
          hashes = await weights.hashes(name);
        } catch (err) {
          // a weight that cannot be read as floats (an integer buffer, a damaged file) is left out, not the worker
          log?.warn('weight-skipped', { dir: candidate, weight: name, error: (err as Error).message });
          continue;
        }
        for (const [i, sha] of hashes.entries()) {
          if (!index.places.has(sha)) index.places.set(sha, { weights, name, index: i });
          chunks++;
        }
      }
      weights.saveCache();
      log?.info('model-indexed', { dir: candidate, weights: weights.names().length, chunks });
    }
    return index;
  }

  has(sha: string): boolean {
    return this.places.has(sha);
  }

  /** A chunk read from the checkpoint that holds it, checked against its hash (a file changed since indexing is not used); null if none. */
  read(sha: string): Uint8Array | null {
    const place = this.places.get(sha);
    if (!place) return null;
    const bytes = place.weights.chunk(place.name, place.index);
    return sha256(bytes) === sha ? bytes : null;
  }

  /** The checkpoint directories indexed. */
  get models(): string[] {
    return this.opened.map((w) => w.dir);
  }

  close(): void {
    for (const w of this.opened) w.close();
  }
}
