import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createModel, gpt2Config, llamaConfig } from '../../src/models/index.ts';
import { AdamW } from '../../src/nn/index.ts';
import { crossEntropy, drainPool, poolStats, randint, setBackend, tensor } from '../../src/tensor/index.ts';

// Activations of 4×128 tokens × 128 wide are large enough (64 Ki values) for the buffer pool.
for (const config of [
  gpt2Config({ vocabSize: 256, maxPositions: 128, layers: 2, heads: 4, hidden: 128 }),
  llamaConfig({ vocabSize: 256, maxPositions: 128, layers: 2, heads: 4, kvHeads: 2, hidden: 128, intermediate: 256 }),
]) {
  test(`${config.arch}: a training loop that releases its buffers reuses all of them after one step, with the same losses`, () => {
    setBackend('js');
    const ids = randint(0, 256, [4, 128], { seed: 3 });
    const targets = tensor(Array.from({ length: 512 }, (_, i) => (i % 128 === 127 ? -100 : ids.data[i + 1])), [4, 128], 'int32');
    const run = (release: boolean) => {
      const model = createModel(config, { seed: 1 });
      const opt = new AdamW(model.parameters(), { lr: 1e-2 });
      drainPool();
      const losses: number[] = [];
      const fresh: number[] = [];
      for (let step = 0; step < 4; step++) {
        const before = poolStats().fresh;
        const loss = crossEntropy(model.forward(ids), targets);
        losses.push(loss.item());
        loss.backward(undefined, { releaseActivations: release });
        opt.step();
        if (release) opt.releaseGrads();
        else opt.zeroGrad();
        fresh.push(poolStats().fresh - before);
      }
      return { losses, fresh, weights: model.parameters().map((p) => p.data) };
    };
    const released = run(true);
    const kept = run(false);
    assert.deepEqual(released.losses, kept.losses);
    assert.deepEqual(released.weights, kept.weights);
    assert.ok(released.fresh[0] > 0);
    assert.deepEqual(released.fresh.slice(1), [0, 0, 0], `fresh large buffers per step: ${released.fresh}`);
  });
}
