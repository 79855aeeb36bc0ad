import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createModel, gpt2Config } from '../../src/models/index.ts';
import { GradientExchange, StageExecutor } from '../../src/pipeline/index.ts';
import { setBackend, tensor } from '../../src/tensor/index.ts';

describe('gradient exchange', () => {
  setBackend('js');
  const model = createModel(gpt2Config({ vocabSize: 20, hidden: 8, layers: 1, heads: 2, maxPositions: 8 }), { seed: 1 });
  const executor = new StageExecutor(model.layers.slice(1, 2), 8, { lr: 1e-3 });
  const names = [...executor.named.keys()].slice(0, 1);

  test('a reduction that fails (a send, or a replica that never answers) holds no slot afterwards', async () => {
    const exchange = new GradientExchange();
    for (let i = 0; i < 100; i++) {
      const group = { key: `step-${i}`, names, peers: ['a', 'b'], index: 0 };
      exchange.deliver(group.key, 1, [tensor([1], [1])]);
      await assert.rejects(exchange.reduce(executor, group, async () => {
        throw new Error('link down');
      }));
    }
    // 100 failed steps later, a reduction still goes through
    const w = executor.named.get(names[0])!;
    const group = { key: 'ok', names, peers: ['a', 'b'], index: 0 };
    exchange.deliver('ok', 1, [tensor(new Float32Array(w.size).fill(2), w.shape)]);
    await exchange.reduce(executor, group, async () => {});
    assert.equal(executor.grads(names)[0].data[0], 2);
    await assert.rejects(exchange.reduce(executor, { key: 'late', names, peers: ['a', 'b'], index: 0 }, async () => {}, 20), { name: 'TimeoutError' });
  });
});
