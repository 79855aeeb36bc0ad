import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { topkBlocks } from '../../src/compress/index.ts';
import { Generator } from '../../src/tensor/index.ts';

/** Sort by magnitude descending, then index ascending; keep k; indices ascending. */
function brute(values: Float32Array, blockSize: number, k: number): { indices: number[]; values: number[] } {
  const kept = Math.min(k, blockSize);
  const indices: number[] = [];
  const out: number[] = [];
  for (let b = 0; b < values.length / blockSize; b++) {
    const order = Array.from({ length: blockSize }, (_, i) => i);
    order.sort((p, q) => Math.abs(values[b * blockSize + q]) - Math.abs(values[b * blockSize + p]) || p - q);
    const top = order.slice(0, kept).sort((p, q) => p - q);
    indices.push(...top);
    out.push(...top.map((i) => values[b * blockSize + i]));
  }
  return { indices, values: out };
}

describe('top-k per block', () => {
  test('matches a brute-force sort, ties to the lower index, for random inputs', () => {
    const rng = new Generator(5);
    for (let trial = 0; trial < 300; trial++) {
      const blockSize = 1 + rng.int(70);
      const blocks = 1 + rng.int(5);
      const k = 1 + rng.int(blockSize + 5);
      const ties = trial % 2 === 0; // small integers: many equal magnitudes, opposite signs
      const values = Float32Array.from({ length: blockSize * blocks }, () => (ties ? rng.int(7) - 3 : rng.normal()));
      const got = topkBlocks(values, blockSize, k);
      const want = brute(values, blockSize, k);
      assert.equal(got.k, Math.min(k, blockSize));
      assert.deepEqual([...got.indices], want.indices, `trial ${trial}`);
      assert.deepEqual([...got.values], want.values, `trial ${trial}`);
    }
  });

  test('ties go to the lower index, and k beyond the block keeps all', () => {
    const got = topkBlocks(new Float32Array([1, -3, 2, 3, 3, -1]), 6, 2);
    assert.deepEqual([...got.indices], [1, 3]);
    assert.deepEqual([...got.values], [-3, 3]);
    const all = topkBlocks(new Float32Array([0, 0, 0]), 3, 10);
    assert.equal(all.k, 3);
    assert.deepEqual([...all.indices], [0, 1, 2]);
  });

  test('bad arguments are InvalidArgumentError', () => {
    const v = new Float32Array(8);
    for (const [blockSize, k] of [[3, 1], [0, 1], [8, 0], [8, 1.5], [65537, 1]]) {
      assert.throws(() => topkBlocks(v, blockSize, k), { name: 'InvalidArgumentError' });
    }
    assert.throws(() => topkBlocks(new Float32Array([1, Number.NaN]), 2, 1), { name: 'InvalidArgumentError' });
    assert.throws(() => topkBlocks(new Float32Array([1, Number.POSITIVE_INFINITY]), 2, 1), { name: 'InvalidArgumentError' });
  });
});
