import type { CheckpointWeights, ModelPart } from '../models/index.ts';
import { chunksOf } from '../p2p/index.ts';
import type { Tensor } from '../tensor/index.ts';

/**
 * The weights of one section as the user streams them to a worker: names and shapes up
 * front, then each weight's chunk addresses (hashes) and the chunks the worker lacks, read
 * one at a time. From a model in memory, or straight from a checkpoint on disk, so that the
 * user never holds more of a section than the chunks in flight.
 */
export interface SectionSource {
  readonly weights: readonly { name: string; shape: number[] }[];
  /** The sha256 of each CHUNK_BYTES chunk of a weight's float32 bytes. */
  hashes(name: string): Promise<string[]>;
  /** Chunk `index` of a weight's float32 bytes. */
  chunk(name: string, index: number): Uint8Array;
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
    weights: [...weights].map(([name, t]) => ({ name, shape: [...t.shape] })),
    hashes: async (name) => of(name).map((c) => c.sha),
    chunk: (name, index) => of(name)[index].bytes,
  };
}

/** A section read from a checkpoint directory chunk by chunk (hashes cached by CheckpointWeights). */
export function checkpointSource(checkpoint: CheckpointWeights, part: ModelPart): SectionSource {
  return {
    weights: checkpoint.partWeights(part),
    hashes: (name) => checkpoint.hashes(name),
    chunk: (name, index) => checkpoint.chunk(name, index),
  };
}
