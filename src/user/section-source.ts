import type { ModelPart, ModelWeights } from '../models/index.ts';
import { chunksOf } from '../p2p/index.ts';
import type { Tensor, WeightFormat } from '../tensor/index.ts';

/**
 * The weights of one section as the user streams them to a worker: names and shapes up
 * front, then each weight's chunk addresses (hashes) and the chunks the worker lacks, read
 * one at a time. From a model in memory, or straight from a checkpoint on disk, so that the
 * user never holds more of a section than the chunks in flight (and, for a compact job, the
 * packed bytes of two matrices).
 */
export interface SectionSource {
  /** Each weight's name and shape, the format it travels in (absent: float32) and its bytes as it travels. */
  readonly weights: readonly SourceWeight[];
  /** The sha256 of each CHUNK_BYTES chunk of a weight's bytes as it travels. */
  hashes(name: string): Promise<string[]>;
  /** Chunk `index` of a weight's bytes as it travels. */
  chunk(name: string, index: number): Uint8Array;
}

export interface SourceWeight {
  name: string;
  shape: number[];
  /** A compact job's matrix travels packed (packedToBytes) in the job's format. */
  format?: WeightFormat;
  bytes: number;
}

/** A section from tensors in memory (shared, not copied). */
export function tensorSource(weights: Map<string, Tensor>): SectionSource {
  const chunks = new Map<string, { sha: string; bytes: Uint8Array }[]>();
  const of = (name: string) => {
    let c = chunks.get(name);
    if (!c) {
      c = chunksOf(weights.get(name)!);
      chunks.set(name, c);
    }
    return c;
  };
  return {
    weights: [...weights].map(([name, t]) => ({ name, shape: [...t.shape], bytes: 4 * t.size })),
    hashes: async (name) => of(name).map((c) => c.sha),
    chunk: (name, index) => of(name)[index].bytes,
  };
}

/**
 * A section read from a checkpoint directory or a GGUF file chunk by chunk (a directory's hashes cached by
 * CheckpointWeights); for a job held in `format`, its matrices travel packed in it.
 */
export function checkpointSource(checkpoint: ModelWeights, part: ModelPart, format: WeightFormat | null = null): SectionSource {
  return {
    weights: checkpoint.partWeights(part).map((w) => {
      const travel = checkpoint.travelFormat(w.name, format);
      return { ...w, ...(travel ? { format: travel } : {}), bytes: checkpoint.byteLength(w.name, format) };
    }),
    hashes: (name) => checkpoint.hashes(name, format),
    chunk: (name, index) => checkpoint.chunk(name, index, undefined, format),
  };
}

/** Two sources of one section's weights as one: `extra`'s weights (an adapter's factors) beside `base`'s. */
export function joinSources(base: SectionSource, extra: SectionSource): SectionSource {
  const own = new Set(extra.weights.map((w) => w.name));
  return {
    weights: [...base.weights, ...extra.weights],
    hashes: (name) => (own.has(name) ? extra.hashes(name) : base.hashes(name)),
    chunk: (name, index) => (own.has(name) ? extra.chunk(name, index) : base.chunk(name, index)),
  };
}

/** A section's source with the weights `copy` holds (a copy of a training job's state) taken from it instead. */
export function overlaySource(source: SectionSource, copy: ReadonlyMap<string, Tensor>): SectionSource {
  const taken = new Map(source.weights.filter((w) => copy.has(w.name)).map((w) => [w.name, copy.get(w.name)!]));
  if (taken.size === source.weights.length) return tensorSource(taken);
  const rest = source.weights.filter((w) => !copy.has(w.name));
  const kept: SectionSource = { weights: rest, hashes: (n) => source.hashes(n), chunk: (n, i) => source.chunk(n, i) };
  return joinSources(kept, tensorSource(taken));
}
