import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  AdamW,
  clipGradNorm,
  cosineWithWarmup,
  LRScheduler,
  type Optimizer,
  SGD,
} from '../../src/nn/index.ts';
import { arange, setBackend, type Tensor } from '../../src/tensor/index.ts';
import { decode, type Encoded, loadFixture, relError } from '../helpers/fixtures.ts';

interface Trajectory {
  p0: Encoded;
  target: Encoded;
  trajectory: Encoded[];
}
const fixture = loadFixture<{ torch: string; cases: Record<string, unknown> }>('torch-optim.json');

const makers: Record<string, (p: Tensor) => Optimizer<{ lr: number }>> = {
  adamw: (p) => new AdamW([p], { lr: 0.01, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0.1 }),
  adamw_defaults: (p) => new AdamW([p], { lr: 0.001 }),
  sgd_momentum: (p) => new SGD([p], { lr: 0.05, momentum: 0.9, weightDecay: 0.01 }),
  sgd_nesterov: (p) => new SGD([p], { lr: 0.05, momentum: 0.9, nesterov: true }),
};

describe(`optimizers against PyTorch ${fixture.torch}`, () => {
  setBackend('js');
  for (const [name, make] of Object.entries(makers)) {
    test(`${name}: 10 steps follow PyTorch's trajectory`, () => {
      const c = fixture.cases[name] as Trajectory;
      const p = decode(c.p0);
      p.requiresGrad = true;
      const target = decode(c.target);
      const weights = arange(1, 13, 1, 'float32').reshape([3, 4]);
      const opt = make(p);
      c.trajectory.forEach((expected, step) => {
        opt.zeroGrad();
        p.sub(target).pow(2).mul(weights).sum().backward();
        opt.step();
        const err = relError(p, expected.data);
        assert.ok(err < 2e-6, `step ${step + 1}: relative error ${err}`);
      });
    });
  }

  test('clipGradNorm scales as torch.nn.utils.clip_grad_norm_', () => {
    const c = fixture.cases.clip as { grads: Encoded[]; maxNorm: number; norm: number; clipped: Encoded[] };
    const params = c.grads.map((g) => {
      const p = decode(g);
      p.requiresGrad = true;
      p.grad = decode(g);
      return p;
    });
    const norm = clipGradNorm(params, c.maxNorm);
    assert.ok(Math.abs(norm - c.norm) / c.norm < 1e-6);
    params.forEach((p, i) => {
      assert.ok(relError(p.grad!, c.clipped[i].data) < 1e-6);
    });
  });
});

describe('learning-rate schedules', () => {
  test('warm-up then cosine to zero, as Hugging Face', () => {
    const f = cosineWithWarmup({ warmupSteps: 10, totalSteps: 110 });
    assert.equal(f(0), 0);
    assert.equal(f(5), 0.5);
    assert.equal(f(10), 1);
    assert.ok(Math.abs(f(60) - 0.5) < 1e-12);
    assert.ok(Math.abs(f(110)) < 1e-12);
    assert.equal(f(500), 0);
  });

  test('LRScheduler drives the optimizer as LambdaLR', () => {
    const p = arange(0, 3, 1, 'float32');
    p.requiresGrad = true;
    const opt = new AdamW([p], { lr: 1 });
    const sched = new LRScheduler(opt, cosineWithWarmup({ warmupSteps: 4, totalSteps: 8, minRatio: 0.1 }));
    assert.equal(opt.lr, 0);
    const seen = [];
    for (let i = 0; i < 8; i++) {
      sched.step();
      seen.push(+opt.lr.toFixed(6));
    }
    assert.deepEqual(seen.slice(0, 4), [0.25, 0.5, 0.75, 1]);
    assert.equal(seen[7], 0.1);
  });

  test('parameter groups keep their own weight decay', () => {
    const a = arange(1, 3, 1, 'float32');
    const b = arange(1, 3, 1, 'float32');
    a.requiresGrad = true;
    b.requiresGrad = true;
    const opt = new AdamW([{ params: [a] }, { params: [b], options: { weightDecay: 0 } }], {
      lr: 0.1,
      weightDecay: 0.5,
    });
    a.grad = arange(0, 2, 1, 'float32').mul(0);
    b.grad = arange(0, 2, 1, 'float32').mul(0);
    opt.step();
    assert.deepEqual(a.toArray(), [0.949999988079071, 1.899999976158142]);
    assert.deepEqual(b.toArray(), [1, 2]);
  });
});
