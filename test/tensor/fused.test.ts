import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { gemmNN, gemmNT, transposed } from '../../src/tensor/kernels/matmul.ts';
import {
  createOrtBackend, gatedMlp, Generator, linear, linears, noGrad, ortAvailable, packWeight, randn, type Tensor, withBackend,
} from '../../src/tensor/index.ts';

const rng = new Generator(5);
const matrix = (rows: number, cols: number, format?: 'int8' | 'int4' | 'bf16') => {
  const w = randn([rows, cols], { generator: rng }).mul(0.05);
  if (format) packWeight(w, format);
  return w;
};
const mlp = (x: Tensor, g: Tensor, u: Tensor, d: Tensor) => linear(linear(x, g).silu().mul(linear(x, u)), d);

/** Largest |a − b| relative to the largest |b|. */
function relative(a: Tensor, b: Tensor): number {
  let err = 0;
  let top = 0;
  for (let i = 0; i < b.size; i++) {
    err = Math.max(err, Math.abs(a.data[i] - b.data[i]));
    top = Math.max(top, Math.abs(b.data[i]));
  }
  return err / top;
}

describe('fused products (linears, gatedMlp)', () => {
  test('gemmNT (A · Bᵀ in place, for a few rows) equals gemmNN over the transposed B, bit for bit', () => {
    for (const [m, k, n] of [[1, 64, 40], [3, 7, 5], [8, 33, 17]]) {
      const a = randn([m, k], { generator: rng }).data as Float32Array;
      const b = randn([n, k], { generator: rng }).data as Float32Array;
      const nt = new Float32Array(m * n);
      const nn = new Float32Array(m * n);
      gemmNT(a, 0, b, 0, nt, 0, m, k, n);
      gemmNN(a, 0, transposed(b, 0, n, k), 0, nn, 0, m, k, n);
      assert.deepEqual(nt, nn, `${m}x${k}x${n}`);
    }
  });

  test('on js they are the ops they stand for, bit for bit', () => {
    withBackend('js', () => {
      const x = randn([2, 3, 64], { generator: rng });
      const ws = [matrix(96, 64), matrix(32, 64, 'int4'), matrix(32, 64)];
      const bias = randn([32], { generator: rng });
      const fused = linears(x, [{ weight: ws[0], bias: null }, { weight: ws[1], bias }, { weight: ws[2], bias: null }]);
      assert.deepEqual(fused[0].data, linear(x, ws[0]).data);
      assert.deepEqual(fused[1].data, linear(x, ws[1], bias).data);
      assert.deepEqual(fused[1].shape, [2, 3, 32]);
      const [g, u, d] = [matrix(128, 64, 'int8'), matrix(128, 64, 'int8'), matrix(64, 128, 'int8')];
      const p = (weight: Tensor) => ({ weight, bias: null });
      assert.deepEqual(gatedMlp(x, p(g), p(u), p(d)).data, mlp(x, g, u, d).data);
    });
  });

  test('on ort they agree with the separate products within float tolerance (f32, int8, int4; bf16 left to linear)', { skip: !ortAvailable() }, () => {
    const ort = createOrtBackend({ threads: 1, minMacs: 0 });
    for (const format of [undefined, 'int8', 'int4', 'bf16'] as const) {
      for (const m of [1, 5]) {
        const x = randn([m, 96], { generator: rng });
        const ws = [matrix(96, 96, format), matrix(32, 96, format), matrix(32, 96, format)];
        const bias = randn([32], { generator: rng });
        const layers = [{ weight: ws[0], bias: null }, { weight: ws[1], bias }, { weight: ws[2], bias: null }];
        const fused = withBackend(ort, () => noGrad(() => linears(x, layers)));
        const separate = withBackend(ort, () => noGrad(() => layers.map((l) => linear(x, l.weight, l.bias))));
        for (let i = 0; i < 3; i++) assert.ok(relative(fused[i], separate[i]) < 1e-5, `${format ?? 'f32'} m=${m}: output ${i}`);
        const [g, u, d] = [matrix(160, 96, format), matrix(160, 96, format), matrix(96, 160, format)];
        const p = (weight: Tensor) => ({ weight, bias: null });
        const y = withBackend(ort, () => noGrad(() => gatedMlp(x, p(g), p(u), p(d))));
        // int8/int4 quantize the MLP's hidden activations on the way into the down product: each path its own rounding
        const tolerance = format === 'int8' || format === 'int4' ? 2e-2 : 1e-5;
        assert.ok(relative(y, withBackend(ort, () => noGrad(() => mlp(x, g, u, d)))) < tolerance, `${format ?? 'f32'} m=${m}: MLP`);
      }
    }
  });

  test('with gradients wanted they record the separate ops', () => {
    withBackend(ortAvailable() ? createOrtBackend({ threads: 1, minMacs: 0 }) : 'js', () => {
      const x = randn([4, 32], { generator: rng });
      x.requiresGrad = true;
      const w = matrix(16, 32);
      const [y] = linears(x, [{ weight: w, bias: null }]);
      y.sum().backward();
      assert.ok(x.grad !== null);
    });
  });
});
