import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { blockShape, blockSide, dctBasis, dctBlocks, idctBlocks, matrixView } from '../../src/compress/index.ts';
import { Generator } from '../../src/tensor/index.ts';

function random(n: number, seed: number): Float32Array {
  const rng = new Generator(seed);
  return Float32Array.from({ length: n }, () => rng.normal());
}

function maxAbs(a: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]));
  return m;
}

function energy(a: ArrayLike<number>): number {
  let e = 0;
  for (let i = 0; i < a.length; i++) e += a[i] * a[i];
  return e;
}

/** Y[k][l] = Σ_i Σ_j s_k s_l cos(π(2i+1)k / 2br) cos(π(2j+1)l / 2bc) X[i][j], straight from the definition. */
function bruteBlock(x: Float32Array, cols: number, r0: number, c0: number, br: number, bc: number): number[] {
  const s = (k: number, n: number) => Math.sqrt((k === 0 ? 1 : 2) / n);
  const y: number[] = [];
  for (let k = 0; k < br; k++) {
    for (let l = 0; l < bc; l++) {
      let sum = 0;
      for (let i = 0; i < br; i++) {
        for (let j = 0; j < bc; j++) {
          sum += s(k, br) * s(l, bc) * Math.cos((Math.PI * (2 * i + 1) * k) / (2 * br)) * Math.cos((Math.PI * (2 * j + 1) * l) / (2 * bc))
            * x[(r0 + i) * cols + c0 + j];
        }
      }
      y.push(sum);
    }
  }
  return y;
}

describe('dct blocks', () => {
  test('block sides are the largest divisors ≤ chunk, any shape tiles', () => {
    assert.deepEqual(blockShape([96, 40], 64), { rows: 96, cols: 40, br: 48, bc: 40, blocks: 2 });
    assert.deepEqual(blockShape([7], 64), { rows: 1, cols: 7, br: 1, bc: 7, blocks: 1 });
    assert.deepEqual(blockShape([3, 5, 64], 8), { rows: 15, cols: 64, br: 5, bc: 8, blocks: 24 });
    assert.deepEqual(blockShape([768, 768], 64), { rows: 768, cols: 768, br: 64, bc: 64, blocks: 144 });
    assert.deepEqual(blockShape([97], 64), { rows: 1, cols: 97, br: 1, bc: 1, blocks: 97 });
    assert.deepEqual(blockShape([], 64), { rows: 1, cols: 1, br: 1, bc: 1, blocks: 1 });
    assert.equal(blockSide(50257, 64), 29);
    assert.deepEqual(matrixView([2, 3, 4]), [6, 4]);
    const bad: [number[], number][] = [
      [[0, 3], 8], [[2.5], 8], [[4], 0], [[4], 257], [[1, 1, 1, 1, 1, 1, 1, 1, 1], 8], [[2 ** 15, 2 ** 14], 8],
    ];
    for (const [shape, chunk] of bad) assert.throws(() => blockShape(shape, chunk), { name: 'InvalidArgumentError' }, `[${shape}] ${chunk}`);
  });

  test('the basis is orthonormal', () => {
    for (const n of [1, 5, 8, 40, 64]) {
      const d = dctBasis(n);
      for (let a = 0; a < n; a++) {
        for (let b = 0; b < n; b++) {
          let s = 0;
          for (let i = 0; i < n; i++) s += d[a * n + i] * d[b * n + i];
          assert.ok(Math.abs(s - (a === b ? 1 : 0)) < 1e-12, `n ${n}: <row ${a}, row ${b}> = ${s}`);
        }
      }
    }
  });

  test('coefficients match the definition summed by brute force, block by block', () => {
    const x = random(6 * 10, 3);
    const { br, bc } = blockShape([6, 10], 8); // [6, 5]: two blocks side by side
    const y = dctBlocks(x, 6, 10, br, bc);
    const want = [...bruteBlock(x, 10, 0, 0, br, bc), ...bruteBlock(x, 10, 0, 5, br, bc)];
    for (let i = 0; i < want.length; i++) assert.ok(Math.abs(y[i] - want[i]) < 1e-5, `coefficient ${i}: ${y[i]} vs ${want[i]}`);
    // a block of ones has only its DC term, √(br · bc)
    const ones = dctBlocks(new Float32Array(16).fill(1), 4, 4, 4, 4);
    assert.ok(Math.abs(ones[0] - 4) < 1e-6);
    assert.ok(maxAbs(ones.subarray(1)) < 1e-6);
  });

  test('inverse(forward(x)) == x and energy is preserved, for shapes that do not divide the chunk', () => {
    let seed = 10;
    for (const shape of [[96, 40], [7], [3, 5, 64], [64, 64], [17, 33], [128, 24]]) {
      for (const chunk of [8, 64]) {
        const { rows, cols, br, bc } = blockShape(shape, chunk);
        const x = random(rows * cols, seed++);
        const y = dctBlocks(x, rows, cols, br, bc);
        const back = idctBlocks(y, rows, cols, br, bc);
        let err = 0;
        for (let i = 0; i < x.length; i++) err = Math.max(err, Math.abs(back[i] - x[i]));
        assert.ok(err < 1e-5 * maxAbs(x), `[${shape}] chunk ${chunk}: max error ${err}`);
        const ex = energy(x);
        assert.ok(Math.abs(energy(y) - ex) < 1e-5 * ex, `[${shape}] chunk ${chunk}: energy ${energy(y)} vs ${ex}`);
      }
    }
  });

  test('each block is transformed on its own (coefficients laid out block by block)', () => {
    const x = new Float32Array(8 * 8);
    x[3 * 8 + 5] = 1; // inside block (0, 1) of a [4, 4] tiling
    const y = dctBlocks(x, 8, 8, 4, 4);
    assert.equal(maxAbs(y.subarray(0, 16)), 0);
    assert.ok(maxAbs(y.subarray(16, 32)) > 0);
    assert.equal(maxAbs(y.subarray(32)), 0);
  });

  test('blocks that do not tile, or data of the wrong length, are InvalidArgumentError', () => {
    assert.throws(() => dctBlocks(new Float32Array(12), 3, 4, 2, 4), { name: 'InvalidArgumentError' });
    assert.throws(() => dctBlocks(new Float32Array(11), 3, 4, 3, 4), { name: 'InvalidArgumentError' });
    assert.throws(() => idctBlocks(new Float32Array(12), 3, 4, 3, 3), { name: 'InvalidArgumentError' });
  });
});
