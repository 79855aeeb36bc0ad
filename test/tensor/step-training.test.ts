// A training step compiled as one graph (src/tensor/backends/graph/step-training.ts) follows eager semantics in every
// order of the training ops, not only forward, backward, step, zeroGrad: zeroGrad first (PyTorch's order), zeroGrad(false),
// a parameter that requires a gradient but is not the optimizer's, a value read after the update, two updates in one
// step, and a backward with no optimizer (the gradient added into .grad). Each against the same step called on js,
// on onnxruntime's CPU provider, to float32 tolerance.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AdamW } from '../../src/nn/index.ts';
import { compileOrtStep } from '../../src/tensor/backends/ort/compiled-step.ts';
import { loadOrtRuntime } from '../../src/tensor/backends/ort/runtime.ts';
import { Generator, jsBackend, randn, type Tensor, trace, type TracedStep, withBackend } from '../../src/tensor/index.ts';

const ort = loadOrtRuntime();

/** Two identical set-ups: w trained by AdamW, u requiring a gradient outside the optimizer. */
function setup() {
  const g = new Generator(3);
  const w = randn([4, 3], { generator: g });
  const u = randn([3], { generator: g });
  w.requiresGrad = true;
  u.requiresGrad = true;
  return { w, u, opt: new AdamW([w], { lr: 0.1, weightDecay: 0.01 }) };
}
type Setup = ReturnType<typeof setup>;

const CASES: Record<string, (s: Setup) => (x: Tensor) => Tensor> = {
  'forward, backward, step, zeroGrad': (s) => (x) => {
    const loss = x.matmul(s.w).add(s.u).tanh().sum();
    loss.backward();
    s.opt.step();
    s.opt.zeroGrad();
    return loss;
  },
  'zeroGrad first, as PyTorch loops do': (s) => (x) => {
    s.opt.zeroGrad();
    const loss = x.matmul(s.w).pow(2).sum();
    loss.backward();
    s.opt.step();
    return loss;
  },
  'zeroGrad(false): gradients kept as zeros': (s) => (x) => {
    const loss = x.matmul(s.w).sum();
    loss.backward();
    s.opt.step();
    s.opt.zeroGrad(false);
    return loss;
  },
  'a value read after the update': (s) => (x) => {
    x.matmul(s.w).sum().backward();
    s.opt.step();
    s.opt.zeroGrad();
    return x.matmul(s.w).sum();
  },
  'two updates in one step': (s) => (x) => {
    for (let k = 0; k < 2; k++) {
      x.matmul(s.w).pow(2).sum().backward();
      s.opt.step();
      s.opt.zeroGrad();
    }
    return s.w.sum();
  },
  'backward only: gradients accumulate in .grad across runs': (s) => (x) => {
    const loss = x.matmul(s.w).add(s.u).sum();
    loss.backward();
    return loss;
  },
};

for (const [name, make] of Object.entries(CASES)) {
  test(`a compiled training step equals eager: ${name}`, () => {
    const xs = Array.from({ length: 3 }, (_, i) => randn([2, 4], { generator: new Generator(10 + i) }));
    const eager = setup();
    const want = withBackend(jsBackend, () => xs.map((x) => make(eager)(x).item()));
    const traced = setup();
    const { step, output } = withBackend(jsBackend, () => trace(make(traced), [xs[0]]));
    const compiled = compileOrtStep(step as TracedStep, (m) => ort.session(m, 1, false), (why) => assert.fail(`refused: ${why}`))!;
    const got = [output.item(), ...xs.slice(1).map((x) => compiled.run([x])[0].data[0])];
    const close = (a: ArrayLike<number>, b: ArrayLike<number>, what: string) => {
      assert.equal(a.length, b.length, what);
      for (let i = 0; i < a.length; i++) assert.ok(Math.abs(a[i] - b[i]) <= 1e-5 * Math.max(1, Math.abs(b[i])), `${what}[${i}]: ${a[i]} against ${b[i]}`);
    };
    close(got, want, 'outputs');
    close(traced.w.data, eager.w.data, 'w');
    for (const key of ['u', 'w'] as const) {
      const [a, b] = [traced[key].grad, eager[key].grad];
      assert.equal(a === null, b === null, `${key}.grad null on one side only`);
      if (a && b) close(a.data, b.data, `${key}.grad`);
    }
    const [ma, mb] = [traced.opt.momentParts(traced.w), eager.opt.momentParts(eager.w)];
    assert.equal(ma?.step, mb?.step, 'AdamW step counts');
    if (ma && mb) ma.parts.forEach((part, i) => close(part, mb.parts[i], `moment ${i}`));
  });
}

test('a compiled step that meets a gradient left from before it is a TraceError, before anything changed', () => {
  const s = setup();
  const run = (x: Tensor) => {
    s.opt.step();
    return x.sum();
  };
  const x = randn([2, 4], { generator: new Generator(1) });
  const { step } = withBackend(jsBackend, () => trace(run, [x]));
  const compiled = compileOrtStep(step as TracedStep, (m) => ort.session(m, 1, false))!;
  s.w.grad = randn([4, 3], { seed: 2 });
  const before = Float32Array.from(s.w.data);
  assert.throws(() => compiled.run([x]), { name: 'TraceError' });
  assert.deepEqual(s.w.data, before);
});
