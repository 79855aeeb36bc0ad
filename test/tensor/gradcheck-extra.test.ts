import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  dropout,
  flatten,
  Generator,
  layerNorm,
  maskedFill,
  randn,
  rmsNorm,
  setBackend,
  split,
  squeeze,
  type Tensor,
  tensor,
  unsqueeze,
} from '../../src/tensor/index.ts';
import { gradcheck } from '../helpers/gradcheck.ts';

/** Ops and variants that have no PyTorch fixture (seeded masks, unaffine norms, views). */
const cases: Record<string, [(...xs: Tensor[]) => Tensor, Tensor[]]> = {
  dropout: [(x) => dropout(x, 0.3, new Generator(5)), [randn([4, 6], { seed: 1 })]],
  maskedFill: [(x) => maskedFill(x, tensor([1, 0, 0, 1], [1, 4], 'int32'), -2), [randn([3, 4], { seed: 2 })]],
  layerNorm_plain: [(x) => layerNorm(x), [randn([3, 5], { seed: 3 })]],
  rmsNorm_plain: [(x) => rmsNorm(x), [randn([3, 5], { seed: 4 })]],
  split_second: [(x) => split(x, [1, 3], 1)[1], [randn([2, 4], { seed: 5 })]],
  squeeze_unsqueeze: [(x) => unsqueeze(squeeze(x, 1), 0).exp(), [randn([3, 1, 2], { seed: 6 })]],
  flatten: [(x) => flatten(x, 1).tanh(), [randn([2, 3, 2], { seed: 7 })]],
  max_all: [(x) => x.max(), [randn([3, 4], { seed: 8 })]],
  chain: [(x, w) => x.matmul(w).softmax(-1).log().mean(), [randn([3, 4], { seed: 9 }), randn([4, 5], { seed: 10 })]],
};

describe('more gradients against float64 finite differences', () => {
  setBackend('js');
  for (const [name, [fn, inputs]] of Object.entries(cases)) {
    test(name, () => {
      const { maxError } = gradcheck(fn, inputs);
      assert.ok(maxError < 1e-6, `max relative error ${maxError}`);
    });
  }

  test('dropout keeps about 1 − p of the elements and scales them', () => {
    const x = randn([100, 100], { seed: 1 }).mul(0).add(1);
    const y = dropout(x, 0.25, new Generator(3));
    const kept = y.toArray().filter((v) => v !== 0);
    assert.ok(Math.abs(kept.length / 10000 - 0.75) < 0.02);
    assert.ok(kept.every((v) => Math.abs(v - 4 / 3) < 1e-6));
    assert.deepEqual(dropout(x, 0.25, new Generator(3)).data, y.data);
  });
});
