// Issue #51: GRPO's objective (src/rl/grpo.ts) against hand-computed values and against PyTorch's autograd of the same
// formulas (scripts/make_grpo_fixture.py wrote test/fixtures/grpo.json with Debian's python3-torch): the advantages,
// the loss and its gradient, for GRPO, Dr. GRPO and DAPO; then the gradient through the log-probabilities of logits.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { InvalidArgumentError } from '../../src/errors.ts';
import { type AdvantageScale, groupAdvantages, grpoLoss, type GrpoOptions, tokenLogprobs } from '../../src/rl/index.ts';
import { randn, tensor, Tensor } from '../../src/tensor/index.ts';
import { gradcheck } from '../helpers/gradcheck.ts';

interface Variant {
  clip_low: number;
  clip_high: number;
  beta: number;
  aggregation: 'sequence' | 'token' | 'constant';
  scale: AdvantageScale;
  max_tokens?: number;
  advantages: number[];
  loss: number;
  grad: number[];
  clipped: number;
}
const fixture = JSON.parse(readFileSync(new URL('../fixtures/grpo.json', import.meta.url), 'utf8')) as {
  groupSize: number; shape: [number, number]; rewards: number[]; mask: number[]; logprobs: number[]; oldLogprobs: number[];
  refLogprobs: number[]; variants: Record<string, Variant>;
};

const leaf = (values: ArrayLike<number>, shape: number[]) => {
  const t = new Tensor(Float64Array.from(values), shape);
  t.requiresGrad = true;
  return t;
};

describe('GRPO\'s objective', () => {
  test('advantages by hand: a group of rewards 1, 0, 0, 1 is ±0.5 over its unbiased std (GRPO) or ±0.5 (Dr. GRPO)', () => {
    const a = groupAdvantages([1, 0, 0, 1, 2, 2, 2, 2], 4);
    const std = Math.sqrt(1 / 3);
    const expected = [0.5, -0.5, -0.5, 0.5].map((x) => x / (std + 1e-4)).concat([0, 0, 0, 0]);
    assert.deepEqual([...a].map((x) => +x.toFixed(12)), expected.map((x) => +x.toFixed(12)));
    assert.deepEqual([...groupAdvantages([1, 0, 0, 1], 4, 'none')], [0.5, -0.5, -0.5, 0.5]);
    assert.throws(() => groupAdvantages([1, 0, 1], 2), InvalidArgumentError);
    assert.throws(() => groupAdvantages([1, Number.NaN], 2), InvalidArgumentError);
  });

  test('one token by hand: inside the clip range the gradient is −ρÂ; past it the loss is the clipped constant and no gradient', () => {
    const one = (ratio: number, advantage: number, options: GrpoOptions = {}) => {
      const lp = leaf([Math.log(0.5 * ratio)], [1, 1]);
      const { loss, stats } = grpoLoss(lp, { oldLogprobs: [Math.log(0.5)], mask: [1], advantages: [advantage] }, { beta: 0, ...options });
      loss.backward();
      return { loss: loss.item(), grad: lp.grad!.data[0], clipped: stats.clipped };
    };
    const close = (a: number, b: number) => assert.ok(Math.abs(a - b) < 1e-12, `${a} vs ${b}`);
    let r = one(1.1, 2);
    close(r.loss, -2.2);
    close(r.grad, -2.2);
    r = one(1.5, 2); // clipped above at 1.2: the objective 2.4, no gradient
    close(r.loss, -2.4);
    close(r.grad, 0);
    assert.equal(r.clipped, 1);
    r = one(1.5, -1); // a negative advantage is not clipped above: min(−1.5, −1.2) = −1.5
    close(r.loss, 1.5);
    close(r.grad, 1.5);
    r = one(0.5, -1); // but below: min(−0.5, −0.8) = −0.8, no gradient
    close(r.loss, 0.8);
    close(r.grad, 0);
    r = one(1.25, 2, { clipHigh: 0.28 }); // DAPO's clip-higher lets 1.25 through
    close(r.loss, -2.5);
    close(r.grad, -2.5);
  });

  for (const [name, v] of Object.entries(fixture.variants)) {
    test(`${name}: the advantages, loss and gradient PyTorch's autograd gives for the same formulas`, () => {
      const advantages = groupAdvantages(fixture.rewards, fixture.groupSize, v.scale);
      advantages.forEach((a, i) => assert.ok(Math.abs(a - v.advantages[i]) < 1e-12, `advantage ${i}: ${a} vs ${v.advantages[i]}`));
      const lp = leaf(fixture.logprobs, fixture.shape);
      const { loss, stats } = grpoLoss(lp, {
        oldLogprobs: fixture.oldLogprobs, refLogprobs: fixture.refLogprobs, mask: fixture.mask, advantages,
      }, {
        clipLow: v.clip_low, clipHigh: v.clip_high, beta: v.beta, aggregation: v.aggregation,
        ...(v.max_tokens === undefined ? {} : { maxTokens: v.max_tokens }),
      });
      loss.backward();
      assert.ok(Math.abs(loss.item() - v.loss) < 1e-12, `loss ${loss.item()} vs torch ${v.loss}`);
      const worst = Math.max(...v.grad.map((g, i) => Math.abs(g - lp.grad!.data[i])));
      assert.ok(worst < 1e-12, `gradient off by ${worst}`);
      assert.ok(Math.abs(stats.clipped - v.clipped) < 1e-12, `clipped ${stats.clipped} vs ${v.clipped}`);
      assert.ok(v.clipped > 0.1, 'the fixture clips some tokens');
    });
  }

  test('micro-batches: the shares of rows [0, 3) and [3, 8) add up to the whole batch\'s loss and gradient, for every aggregation', () => {
    const v = fixture.variants['grpo-kl-token'];
    for (const aggregation of ['sequence', 'token', 'constant'] as const) {
      const options = { clipLow: v.clip_low, clipHigh: v.clip_high, beta: v.beta, aggregation, maxTokens: 6 };
      const batch = {
        oldLogprobs: fixture.oldLogprobs, refLogprobs: fixture.refLogprobs, mask: fixture.mask,
        advantages: groupAdvantages(fixture.rewards, fixture.groupSize),
      };
      const whole = leaf(fixture.logprobs, fixture.shape);
      const all = grpoLoss(whole, batch, options).loss;
      all.backward();
      const t = fixture.shape[1];
      let sum = 0;
      const grads: number[] = [];
      for (const [a, b] of [[0, 3], [3, 8]] as const) {
        const part = leaf(fixture.logprobs.slice(a * t, b * t), [b - a, t]);
        const share = grpoLoss(part, batch, options, [a, b]).loss;
        share.backward();
        sum += share.item();
        grads.push(...part.grad!.data);
      }
      assert.ok(Math.abs(sum - all.item()) < 1e-12, `${aggregation}: ${sum} vs ${all.item()}`);
      assert.ok(grads.every((g, i) => Math.abs(g - whole.grad!.data[i]) < 1e-15), aggregation);
    }
  });

  test('on-policy (no old log-probabilities): every ratio is 1 and the gradient is −Â per token, weighted', () => {
    const lp = leaf([-1, -2, -0.5, -3], [2, 2]);
    const { loss, stats } = grpoLoss(lp, { mask: [1, 1, 1, 0], advantages: [1, -2] }, { beta: 0, aggregation: 'token' });
    loss.backward();
    assert.equal(stats.ratio, 1);
    assert.ok(Math.abs(loss.item() - -(1 + 1 - 2) / 3) < 1e-15);
    assert.deepEqual([...lp.grad!.data].map((g) => +g.toFixed(12)), [-1 / 3, -1 / 3, 2 / 3, 0].map((g) => +g.toFixed(12)));
  });

  test('the gradient reaches the logits through the tokens\' log-probabilities (finite differences)', () => {
    const [n, t, vocab] = [4, 3, 7];
    const targets = tensor([1, 4, 6, 0, 2, 2, 5, 3, 1, 6, 0, 4], [n, t], 'int32');
    const old = randn([n, t], { seed: 3, dtype: 'float64' }).mul(0.1).sub(2).data;
    const ref = randn([n, t], { seed: 4, dtype: 'float64' }).mul(0.1).sub(2).data;
    const mask = [1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 1];
    const batch = { oldLogprobs: old, refLogprobs: ref, mask, advantages: groupAdvantages([1, 0, 0.5, 0], 2) };
    const logits = randn([n, t, vocab], { seed: 5, dtype: 'float64' });
    const { maxError } = gradcheck((x) => grpoLoss(tokenLogprobs(x, targets), batch, { beta: 0.04, clipHigh: 0.28 }).loss, [logits]);
    assert.ok(maxError < 1e-6, `relative error ${maxError}`);
  });

  test('bad input is refused by name', () => {
    const lp = leaf([-1, -1], [1, 2]);
    assert.throws(() => grpoLoss(lp, { oldLogprobs: [-1, -1], mask: [1, 1], advantages: [1] }), /reference policy/);
    assert.throws(() => grpoLoss(lp, { oldLogprobs: [-1], mask: [1, 1], advantages: [1] }, { beta: 0 }), /oldLogprobs holds 1/);
    assert.throws(() => grpoLoss(lp, { mask: [1, 1], advantages: [1, 1] }, { beta: 0 }), /1 rows for rows \[0, 2\)/);
    assert.throws(() => grpoLoss(lp, { oldLogprobs: [-1, -1], mask: [1, 1], advantages: [1] }, { beta: 0, aggregation: 'constant' }), /maxTokens/);
  });
});
