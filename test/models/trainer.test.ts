import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer, llamaConfig, LocalTrainer } from '../../src/models/index.ts';
import { AdamW, clipGradNorm, cosineWithWarmup, LRScheduler } from '../../src/nn/index.ts';
import { crossEntropy, Generator, setBackend } from '../../src/tensor/index.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);

describe('LocalTrainer', () => {
  setBackend('js');
  for (const config of [
    gpt2Config({ vocabSize: 257, hidden: 32, layers: 2, heads: 4, maxPositions: 32 }),
    llamaConfig({ vocabSize: 257, hidden: 32, layers: 2, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 32 }),
  ]) {
    test(`${config.arch}: recycling activations and gradients changes no bit of the training`, () => {
      const task = additionTask({ seed: 1 });
      const a = createModel(config, { seed: 9 });
      const trainer = new LocalTrainer(a, { lr: 3e-3, totalSteps: 6, warmupSteps: 2 });
      const b = createModel(config, { seed: 9 });
      const decay = [...b.namedParameters()].filter(([, p]) => p.ndim >= 2).map(([, p]) => p);
      const rest = [...b.namedParameters()].filter(([, p]) => p.ndim < 2).map(([, p]) => p);
      const opt = new AdamW(
        [
          { params: decay, options: { weightDecay: 0.1 } },
          { params: rest, options: { weightDecay: 0 } },
        ],
        { lr: 3e-3 },
      );
      const sched = new LRScheduler(opt, cosineWithWarmup({ warmupSteps: 2, totalSteps: 6, minRatio: 0.1 }));
      const [ra, rb] = [new Generator(4), new Generator(4)];
      for (let s = 0; s < 6; s++) {
        const got = trainer.step(taskBatch(task, tok, ra, 8, 256)).loss;
        const batch = taskBatch(task, tok, rb, 8, 256);
        const loss = crossEntropy(b.forward(batch.input), batch.target);
        loss.backward();
        clipGradNorm(b.parameters(), 1);
        opt.step();
        opt.zeroGrad();
        sched.step();
        assert.equal(got, loss.item(), `step ${s + 1}`);
      }
      for (const [name, p] of a.namedParameters()) assert.deepEqual(p.data, b.hfStateDict().get(name)!.data, name);
    });
  }
});
