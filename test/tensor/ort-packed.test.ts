// Products with compact weights on the ort backend (src/tensor/backends/ort/packed.ts): int8 and int4 through
// onnxruntime's MatMulNBits, bf16 through its dense product, each against the exact js kernel within a bound derived
// from how onnxruntime computes.
//
// MatMulNBits runs at accuracy_level 4: it quantizes each block of 32 of the input row to int8 with the scale
// amax / 127 (amax: the block's largest |a|) and multiplies integers, so an input a_t reaches the product as â_t with
// |â_t − a_t| ≤ amax_b(t) / 254 (half a step, rounding to nearest). The weights' values are exactly the js kernel's
// (the layout and zero points are the same; accuracy_level 0 agrees to float rounding, tested below), so per output
//   |y_ort − y_js| ≤ Σ_t |w_t| · amax_b(t) / 254  +  float rounding ((k + 1) · 2⁻²⁴ · Σ_t |a_t w_t|, any order).
// That bound is what each output is held to. Measured on these shapes (randn inputs and weights, onnxruntime 1.30 on
// an AVX-512 VNNI CPU), the error reaches 0.07–0.13 of it, and relative to the largest |y| it is at most 5.7e-3 for
// both int8 and int4 (MatMulNBits quantizes the input, not the weights, any further); the second check holds that under
// 2e-2, a margin of 3.5. bf16 runs the dense float32 product: 4.5e-7 relative, held under 1e-5.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { matMulNBitsGraph } from '../../src/tensor/backends/ort/packed.ts';
import { loadOrtRuntime } from '../../src/tensor/backends/ort/runtime.ts';
import {
  createOrtBackend, linear, ortAvailable, packMatrix, packWeight, randn, type Tensor, tensor, unpackMatrix, type WeightFormat, withBackend,
} from '../../src/tensor/index.ts';
import { packedLinearJs } from '../../src/tensor/quant/kernels.ts';

const skip = ortAvailable() ? false : 'onnxruntime does not load on this machine';

/**
 * The largest |y − ref| over the per-output bound, and over the largest |ref|. With a bias (added to each product
 * after it, rounding once more on each side), the bound grows by 2 · 2⁻²⁴ · (|ref| + |b|).
 */
function compare(
  x: Float32Array, m: number, w: Float32Array, n: number, k: number, y: Float32Array, ref: Float32Array, format: WeightFormat,
  bias?: ArrayLike<number>,
) {
  let ratio = 0;
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < m; i++) {
    const amax = new Float64Array(Math.ceil(k / 32));
    for (let t = 0; t < k; t++) amax[t >> 5] = Math.max(amax[t >> 5], Math.abs(x[i * k + t]));
    for (let j = 0; j < n; j++) {
      let quant = 0;
      let abs = 0;
      for (let t = 0; t < k; t++) {
        const wt = Math.abs(w[j * k + t]);
        quant += (wt * amax[t >> 5]) / 254;
        abs += wt * Math.abs(x[i * k + t]);
      }
      let bound = (format === 'bf16' ? 0 : quant) + (k + 1) * 2 ** -24 * abs;
      if (bias) bound += 2 * 2 ** -24 * (Math.abs(ref[i * n + j]) + Math.abs(bias[j]));
      const d = Math.abs(y[i * n + j] - ref[i * n + j]);
      ratio = Math.max(ratio, d / bound);
      diff = Math.max(diff, d);
      scale = Math.max(scale, Math.abs(ref[i * n + j]));
    }
  }
  return { ratio, relative: diff / scale };
}

const SHAPES: [m: number, k: number, n: number][] = [
  [1, 1024, 96],
  [1, 1000, 130], // ragged K: 31 blocks and 8 weights
  [5, 333, 64], // ragged K, M > 1
  [16, 512, 48],
];

describe('compact weights on the ort backend', { skip }, () => {
  for (const runtime of ['ffi', 'binding'] as const) {
    for (const format of ['int8', 'int4', 'bf16'] as const) {
      test(`${format} (${runtime}): packedLinear equals the js kernel within the derived bound`, (t) => {
        const ort = createOrtBackend({ threads: 1, runtime });
        const stats: string[] = [];
        for (const [m, k, n] of SHAPES) {
          const x = randn([m, k], { seed: 10 + m }).data as Float32Array;
          const p = packMatrix(randn([n, k], { seed: 20 + n }).data, n, k, format);
          const w = unpackMatrix(p);
          const ref = new Float32Array(m * n);
          packedLinearJs(x, m, p, ref);
          const y = new Float32Array(m * n);
          assert.equal(ort.packedLinear!(x, m, p, y), true, `[${m}, ${k}] · [${n}, ${k}]ᵀ runs on ort`);
          const { ratio, relative } = compare(x, m, w, n, k, y, ref, format);
          stats.push(`[${m},${k},${n}]: ${ratio.toFixed(3)} of the bound, ${relative.toExponential(1)} relative`);
          assert.ok(ratio <= 1, `[${m}, ${k}] · [${n}, ${k}]ᵀ: ${ratio} of the bound`);
          assert.ok(relative < (format === 'bf16' ? 1e-5 : 2e-2), `[${m}, ${k}] · [${n}, ${k}]ᵀ: ${relative} relative`);
          // a second call reuses the weight's session; a second weight of the same shape gets its own
          const again = new Float32Array(m * n);
          ort.packedLinear!(x, m, p, again);
          assert.deepEqual(again, y);
          const p2 = packMatrix(randn([n, k], { seed: 30 + n }).data, n, k, format);
          packedLinearJs(x, m, p2, ref);
          ort.packedLinear!(x, m, p2, y);
          assert.ok(compare(x, m, unpackMatrix(p2), n, k, y, ref, format).ratio <= 1, 'a second weight of the same shape');
        }
        t.diagnostic(stats.join('; '));
      });
    }
  }

  test('products above SINGLE_THREAD_BELOW_MACS run on a pool of 2 threads, within the same bound', () => {
    const ort = createOrtBackend({ threads: 2 });
    const [m, k, n] = [2, 1024, 1024];
    const x = randn([m, k], { seed: 5 }).data as Float32Array;
    for (const format of ['int8', 'int4', 'bf16'] as const) {
      const p = packMatrix(randn([n, k], { seed: 6 }).data, n, k, format);
      const ref = new Float32Array(m * n);
      packedLinearJs(x, m, p, ref);
      const y = new Float32Array(m * n);
      assert.equal(ort.packedLinear!(x, m, p, y), true);
      assert.ok(compare(x, m, unpackMatrix(p), n, k, y, ref, format).ratio <= 1, format);
    }
  });

  test('small products stay on the js kernel', () => {
    const ort = createOrtBackend({ threads: 1 });
    const p = packMatrix(randn([16, 64], { seed: 1 }).data, 16, 64, 'int4');
    assert.equal(ort.packedLinear!(new Float32Array(64), 1, p, new Float32Array(16)), false);
  });

  test('our layout is MatMulNBits\' with its default zero points: at accuracy_level 0 it agrees to float rounding', () => {
    const ort = loadOrtRuntime();
    for (const format of ['int8', 'int4'] as const) {
      const [m, k, n] = [3, 200, 40];
      const x = randn([m, k], { seed: 7 }).data as Float32Array;
      const p = packMatrix(randn([n, k], { seed: 8 }).data, n, k, format);
      const ref = new Float32Array(m * n);
      packedLinearJs(x, m, p, ref);
      const y = new Float32Array(m * n);
      ort.session(matMulNBitsGraph(p as typeof p & { format: typeof format }, 0), 1, false)
        .run([{ name: 'a', data: x, dims: [m, k] }], [{ name: 'y', data: y, dims: [m, n] }]);
      for (let i = 0; i < y.length; i++) assert.ok(Math.abs(y[i] - ref[i]) <= 1e-5 * Math.max(1, Math.abs(ref[i])), `${format} output ${i}`);
    }
  });

  for (const format of ['int8', 'int4', 'bf16'] as const) {
    test(`${format}: linear() with a packed weight on createOrtBackend({ threads: 1 }) matches js`, () => {
      const x = randn([2, 3, 320], { seed: 2 });
      const weight = tensor(Float32Array.from(randn([200, 320], { seed: 3 }).data), [200, 320]);
      const bias = randn([200], { seed: 4 });
      packWeight(weight, format);
      const ref = withBackend('js', () => linear(x, weight, bias));
      const y = withBackend(createOrtBackend({ threads: 1 }), () => linear(x, weight, bias));
      assert.deepEqual(y.shape, [2, 3, 200]);
      const w = unpackMatrix(weight.packed!);
      const [xd, yd, rd] = [x.data, y.data, ref.data] as Float32Array[];
      const { ratio } = compare(xd, 6, w, 200, 320, yd, rd, format, bias.data);
      assert.ok(ratio <= 1, `${ratio} of the bound`);
    });
  }

  for (const format of ['int4', 'bf16'] as const) {
    test(`${format}: the input gradient through a packed weight on ort (the weight unpacked, a dense gemm) equals js's exact kernel to float rounding`, () => {
      const weight = tensor(Float32Array.from(randn([96, 160], { seed: 5 }).data), [96, 160]);
      packWeight(weight, format);
      const grad = (backend: Parameters<typeof withBackend>[0]) => withBackend(backend, () => {
        const x = randn([2, 5, 160], { seed: 6 });
        x.requiresGrad = true;
        linear(x, weight, null).mul(randn([2, 5, 96], { seed: 7 })).sum().backward();
        return x.grad!.data as Float32Array;
      });
      const [js, ort] = [grad('js'), grad(createOrtBackend({ threads: 1 }))];
      let diff = 0;
      let scale = 0;
      for (let i = 0; i < js.length; i++) {
        diff = Math.max(diff, Math.abs(js[i] - ort[i]));
        scale = Math.max(scale, Math.abs(js[i]));
      }
      assert.ok(diff / scale < 1e-5, `relative ${diff / scale}`);
    });
  }

  for (const runtime of ['ffi', 'binding'] as const) {
    test(`${runtime}: a weight's sessions are released with it (releasePacked); used again, it builds anew and computes the same`, () => {
      // every product on onnxruntime, however small
      const backend = createOrtBackend({ threads: 1, runtime, minMacs: 0 });
      const weights = [0, 1].map((seed) => {
        const w = tensor(Float32Array.from(randn([64, 96], { seed }).data), [64, 96]);
        packWeight(w, 'int4');
        return w;
      });
      const x = randn([3, 96], { seed: 9 });
      const run = () => withBackend(backend, () => weights.map((w) => [...linear(x, w, null).data]));
      const first = run();
      assert.equal(backend.packedSessions!(), 2, 'a session per weight');
      // each session's prepacked copy is counted: the weight's blocks and its scales, as the session holds them
      const copy = (w: Tensor) => w.packed!.data.byteLength + w.packed!.scales.byteLength;
      assert.equal(backend.prepackedBytes!([weights[0].packed!]), copy(weights[0]));
      assert.equal(backend.prepackedBytes!(weights.map((w) => w.packed!)), copy(weights[0]) + copy(weights[1]));
      backend.releasePacked!([weights[0].packed!]);
      assert.equal(backend.prepackedBytes!([weights[0].packed!]), 0, 'a released weight keeps no copy');
      assert.equal(backend.packedSessions!(), 1, 'the released weight\'s session is gone, the other\'s kept');
      assert.deepEqual(run(), first);
      assert.equal(backend.packedSessions!(), 2);
      backend.releasePacked!(weights.map((w) => w.packed!));
      assert.equal(backend.packedSessions!(), 0);
      assert.equal(backend.prepackedBytes!(weights.map((w) => w.packed!)), 0);
    });
  }
});
