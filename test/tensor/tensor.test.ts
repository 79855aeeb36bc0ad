import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { bfloat16ToFloat, floatToBfloat16, floatToHalf, halfToFloat } from '../../src/tensor/dtype.ts';
import {
  arange,
  cat,
  createOrtBackend,
  Generator,
  jsBackend,
  layerNorm,
  matmul,
  ortAvailable,
  randn,
  scaledDotProductAttention,
  setBackend,
  type Tensor,
  tensor,
  withBackend,
  zeros,
} from '../../src/tensor/index.ts';
import { relError } from '../helpers/fixtures.ts';

describe('tensors', () => {
  setBackend('js');

  test('nested arrays, shapes and PyTorch-style methods', () => {
    const x = tensor([
      [1, 2, 3],
      [4, 5, 6],
    ]);
    assert.deepEqual([...x.shape], [2, 3]);
    assert.deepEqual(x.transpose(0, 1).toArray(), [1, 4, 2, 5, 3, 6]);
    assert.deepEqual(x.reshape([3, -1]).shape, [3, 2]);
    assert.deepEqual(x.sum(-1).toArray(), [6, 15]);
    assert.deepEqual(x.mean().toArray(), [3.5]);
    assert.deepEqual(x.max(1).toArray(), [3, 6]);
    assert.deepEqual(x.argmax(-1).toArray(), [2, 2]);
    assert.deepEqual(x.narrow(1, 1, 2).toArray(), [2, 3, 5, 6]);
    assert.deepEqual(x.unsqueeze(0).shape, [1, 2, 3]);
  });

  test('split and cat round-trip', () => {
    const x = arange(0, 24, 1, 'float32').reshape([2, 3, 4]);
    const parts = x.split([1, 3], 2);
    assert.deepEqual(parts[1].shape, [2, 3, 3]);
    assert.deepEqual(cat(parts, 2).toArray(), x.toArray());
    assert.equal(x.split(2, 1).length, 2);
  });

  test('bad shapes and dims give typed errors', () => {
    const x = zeros([2, 3]);
    assert.throws(() => x.add(zeros([4])), { name: 'ShapeMismatchError' });
    assert.throws(() => x.matmul(zeros([2, 3])), { name: 'ShapeMismatchError' });
    assert.throws(() => x.reshape([4, 2]), { name: 'ShapeMismatchError' });
    assert.throws(() => x.sum(5), { name: 'InvalidArgumentError' });
    assert.throws(() => x.add(zeros([2, 3], 'float64')), { name: 'DTypeError' });
    assert.throws(() => x.narrow(1, 2, 5), { name: 'InvalidArgumentError' });
  });

  test('float16 and bfloat16 conversions round to nearest even, as PyTorch', () => {
    assert.equal(floatToHalf(1 / 3), 0x3555);
    assert.equal(halfToFloat(0x3555), 0.333251953125);
    assert.equal(floatToHalf(65520), 0x7c00);
    assert.equal(halfToFloat(0x0001), 2 ** -24);
    assert.equal(floatToHalf(-0), 0x8000);
    assert.equal(floatToBfloat16(1 / 3), 0x3eab);
    assert.equal(bfloat16ToFloat(0x3eab), 0.333984375);
    assert.ok(Number.isNaN(bfloat16ToFloat(floatToBfloat16(Number.NaN))));
    for (let h = 0; h < 0x7c00; h += 7) assert.equal(floatToHalf(halfToFloat(h)), h);
  });

  test('seeded random numbers are the same on every machine', () => {
    const g = new Generator(42);
    assert.deepEqual(
      [g.nextUint32(), g.nextUint32(), g.uniform(), g.normal()],
      [2837322924, 544945897, 0.11170190572738647, 1.6146213886658298],
    );
    assert.deepEqual(
      randn([4], { seed: 7 }).toArray(),
      [-0.7277058959007263, -0.05604055896401405, 0.5095173120498657, 0.9654650688171387],
    );
  });

  test('attention with every key masked gives zeros, not NaN', () => {
    const q = randn([1, 1, 2, 4], { seed: 1 });
    const mask = tensor([0, 0], [1, 1, 1, 2], 'int32');
    const out = scaledDotProductAttention(q, q, q, { mask });
    assert.deepEqual(out.toArray(), new Array(8).fill(0));
  });
});

describe('backends', () => {
  test('the js GEMM equals a naive double-precision product rounded once', () => {
    const a = randn([37, 45], { seed: 3 });
    const b = randn([45, 29], { seed: 4 });
    const c = withBackend('js', () => matmul(a, b));
    for (let i = 0; i < 37; i++) {
      for (let j = 0; j < 29; j++) {
        let s = 0;
        for (let p = 0; p < 45; p++) s += a.data[i * 45 + p] * b.data[p * 29 + j];
        assert.equal(c.data[i * 29 + j], Math.fround(s));
      }
    }
  });

  for (const runtime of ['ffi', 'binding'] as const) test(`the ort backend (${runtime}) agrees with js within float tolerance`, { skip: !ortAvailable() }, () => {
    const ort = createOrtBackend({ threads: 1, minMacs: 0, runtime });
    assert.equal(ort.runtime, runtime);
    for (const [as, bs] of [
      [
        [64, 96],
        [96, 80],
      ],
      [
        [3, 16, 32],
        [3, 32, 8],
      ],
      [
        [2, 16, 32],
        [32, 8],
      ],
      [
        [4, 1, 8, 16],
        [3, 16, 8],
      ],
    ]) {
      const a = randn(as, { seed: 5 });
      const b = randn(bs, { seed: 6 });
      a.requiresGrad = true;
      b.requiresGrad = true;
      const ref = withBackend(jsBackend, () => matmul(a, b));
      withBackend(jsBackend, () => ref.sum().backward());
      const [ga, gb] = [a.grad!, b.grad!];
      a.grad = null;
      b.grad = null;
      const fast = withBackend(ort, () => matmul(a, b));
      withBackend(ort, () => fast.sum().backward());
      assert.ok(relError(fast, ref) < 1e-5, `forward ${as} @ ${bs}`);
      assert.ok(relError(a.grad!, ga) < 1e-5 && relError(b.grad!, gb) < 1e-5, `grads ${as} @ ${bs}`);
    }
  });

  for (const runtime of ['ffi', 'binding'] as const) test(`ort elementwise kernels (${runtime}) agree with js within float tolerance`, { skip: !ortAvailable() }, () => {
    const ort = createOrtBackend({ threads: 1, minElements: 0, runtime });
    for (const op of ['exp', 'log', 'tanh', 'sigmoid', 'silu', 'gelu'] as const) {
      const x = randn([64, 80], { seed: 9 });
      if (op === 'log') for (let i = 0; i < x.size; i++) x.data[i] = Math.abs(x.data[i]) + 0.1;
      x.requiresGrad = true;
      const ref = withBackend(jsBackend, () => x[op]());
      withBackend(jsBackend, () => ref.sum().backward());
      const g = x.grad!;
      x.grad = null;
      const fast = withBackend(ort, () => x[op]());
      withBackend(ort, () => fast.sum().backward());
      assert.ok(relError(fast, ref) < 1e-5, `${op} forward ${relError(fast, ref)}`);
      assert.ok(relError(x.grad!, g) < 1e-5, `${op} backward ${relError(x.grad!, g)}`);
    }
  });

  test('ort softmax (causal, with cached keys, and full) and layer norm agree with js within float tolerance', { skip: !ortAvailable() }, () => {
    const ort = createOrtBackend({ threads: 1, minElements: 0 });
    const check = (label: string, inputs: Tensor[], f: () => Tensor) => {
      const weights = randn(f().shape, { seed: 11 });
      const run = (backend: typeof jsBackend) => {
        for (const x of inputs) x.grad = null;
        const out = withBackend(backend, f);
        withBackend(backend, () => out.mul(weights).sum().backward());
        return [out, ...inputs.map((x) => x.grad!)];
      };
      const ref = run(jsBackend);
      const fast = run(ort);
      ref.forEach((r, i) => assert.ok(relError(fast[i], r) < 1e-5, `${label} [${i}] ${relError(fast[i], r)}`));
    };
    const q = randn([2, 3, 24, 16], { seed: 1 });
    const k = randn([2, 3, 40, 16], { seed: 2 });
    const v = randn([2, 3, 40, 16], { seed: 3 });
    for (const t of [q, k, v]) t.requiresGrad = true;
    check('causal attention over 16 cached keys', [q, k, v], () => scaledDotProductAttention(q, k, v, { causal: true }));
    check('full attention', [q, k, v], () => scaledDotProductAttention(q, k, v));
    const x = randn([2, 48, 96], { seed: 4 });
    const w = randn([96], { seed: 5 });
    const b = randn([96], { seed: 6 });
    for (const t of [x, w, b]) t.requiresGrad = true;
    check('layer norm', [x, w, b], () => layerNorm(x, w, b));
    check('layer norm without affine', [x], () => layerNorm(x));
  });

  test('the ffi runtime reads and writes our buffers in place (no fresh pages per call)', { skip: !ortAvailable() }, () => {
    const ort = createOrtBackend({ threads: 1, runtime: 'ffi' });
    const [m, k, n] = [256, 256, 16384]; // a 16 MiB output: 4096 pages if it were copied
    const a = new Float32Array(m * k).fill(0.5);
    const b = new Float32Array(k * n).fill(0.25);
    const out = new Float32Array(m * n);
    const spec = { batch: 1, m, k, n, transA: false, transB: false, batchedA: false, batchedB: false };
    ort.matmul(a, b, out, spec);
    const before = process.resourceUsage().minorPageFault;
    for (let i = 0; i < 3; i++) ort.matmul(a, b, out, spec);
    const faults = process.resourceUsage().minorPageFault - before;
    assert.ok(faults < 400, `${faults} page faults for three products into a 16 MiB buffer`);
    assert.equal(out[0], 32);
    assert.equal(out[m * n - 1], 32);
  });

  test('unknown backends are refused with a typed error', () => {
    assert.throws(() => setBackend('cuda' as 'js'), { name: 'InvalidArgumentError' });
  });
});
