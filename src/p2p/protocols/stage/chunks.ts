import { createHash } from 'node:crypto';
import { CHUNK_BYTES } from './constants.ts';

/**
 * Content addressing of weights: a weight's bytes cut into CHUNK_BYTES chunks, each named by
 * its sha256. The manifest of a load lists these addresses; the worker asks for the ones it
 * lacks and checks each chunk against its address on arrival.
 */

export function sha256(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/** One weight of a section as the manifest of a load lists it. */
export interface WeightEntry {
  name: string;
  shape: number[];
  /** The sha256 of each chunk of its bytes as they travel (float32, or packed in `format`), in order. */
  chunks: string[];
  /** A compact job's matrix travels packed in the job's format (the tensor layer's packedToBytes); absent: float32. */
  format?: 'bf16' | 'int8' | 'int4';
}

/** The bytes of a tensor (anything with typed-array data) cut into chunks, with their addresses. */
export function chunksOf(t: { data: ArrayBufferView }): { sha: string; bytes: Uint8Array }[] {
  const all = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  const out = [];
  for (let offset = 0; offset < all.length || offset === 0; offset += CHUNK_BYTES) {
    const bytes = all.subarray(offset, Math.min(all.length, offset + CHUNK_BYTES));
    out.push({ sha: sha256(bytes), bytes });
    if (all.length === 0) break;
  }
  return out;
}

export const HEX64 = /^[0-9a-f]{64}$/;
