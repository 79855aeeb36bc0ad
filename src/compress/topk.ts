import { InvalidArgumentError } from '../errors.ts';

/**
 * Top-k selection per block: in each block of `blockSize` consecutive values, the k of largest
 * magnitude, ties broken by the lower index, returned with indices ascending. Deterministic, so
 * every holder that selects from the same values keeps the same coefficients.
 */

/** The kept coefficients of every block: `k` per block, block b at [b·k, (b + 1)·k). */
export interface TopK {
  /** Kept per block: the requested k clamped to the block size. */
  k: number;
  /** Index inside the block, strictly ascending within each block. */
  indices: Uint16Array;
  /** The value at each kept index. */
  values: Float32Array;
}

/** The largest block a u16 index can address. */
export const MAX_BLOCK_SIZE = 65536;

/**
 * Selects the top-k of each block. `values.length` must be a multiple of `blockSize`
 * (1..65,536), every value finite, and k an integer ≥ 1 (clamped to the block size).
 * @example topkBlocks(new Float32Array([1, -3, 2, 3]), 4, 2) // k 2, indices [1, 3], values [-3, 3]
 */
export function topkBlocks(values: Float32Array, blockSize: number, k: number): TopK {
  if (!Number.isInteger(blockSize) || blockSize < 1 || blockSize > MAX_BLOCK_SIZE || values.length % blockSize !== 0) {
    throw new InvalidArgumentError(`block size ${blockSize} must be in 1..${MAX_BLOCK_SIZE} and divide ${values.length} values`);
  }
  if (!Number.isInteger(k) || k < 1) throw new InvalidArgumentError(`k must be an integer ≥ 1, got ${k}`);
  for (let i = 0; i < values.length; i++) {
    if (!Number.isFinite(values[i])) throw new InvalidArgumentError(`value ${i} is not finite (${values[i]})`);
  }
  const kept = Math.min(k, blockSize);
  const blocks = values.length / blockSize;
  const indices = new Uint16Array(blocks * kept);
  const out = new Float32Array(blocks * kept);
  const heap = new Int32Array(kept);
  for (let b = 0; b < blocks; b++) {
    const base = b * blockSize;
    selectBlock(values, base, blockSize, heap);
    heap.sort();
    for (let j = 0; j < kept; j++) {
      indices[b * kept + j] = heap[j];
      out[b * kept + j] = values[base + heap[j]];
    }
  }
  return { k: kept, indices, values: out };
}

/**
 * Fills `heap` (size k ≤ n) with the in-block positions of the top-k of values[base, base + n).
 * A min-heap whose root is the weakest kept value (smallest magnitude, then highest index);
 * scanning in index order, a later value enters only if strictly larger than the root.
 */
function selectBlock(values: Float32Array, base: number, n: number, heap: Int32Array): void {
  const k = heap.length;
  const weaker = (a: number, b: number): boolean => {
    const ma = Math.abs(values[base + a]);
    const mb = Math.abs(values[base + b]);
    return ma < mb || (ma === mb && a > b);
  };
  const siftDown = (start: number): void => {
    let i = start;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= k) return;
      const r = l + 1;
      const c = r < k && weaker(heap[r], heap[l]) ? r : l;
      if (!weaker(heap[c], heap[i])) return;
      const tmp = heap[i];
      heap[i] = heap[c];
      heap[c] = tmp;
      i = c;
    }
  };
  for (let i = 0; i < k; i++) heap[i] = i;
  for (let i = (k >> 1) - 1; i >= 0; i--) siftDown(i);
  for (let i = k; i < n; i++) {
    if (Math.abs(values[base + i]) > Math.abs(values[base + heap[0]])) {
      heap[0] = i;
      siftDown(0);
    }
  }
}
