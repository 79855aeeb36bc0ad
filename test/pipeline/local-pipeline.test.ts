import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, type CausalLM, createModel, gpt2Config, HFTokenizer, llamaConfig, LocalTrainer, type ModelConfig } from '../../src/models/index.ts';
import { localPipeline, PipelineTrainer, type ScheduleName } from '../../src/pipeline/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { assertWeightsClose } from '../helpers/weights.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const STEPS = 20;

/** Losses and final weights of one process training with micro-batches. */
function reference(config: ModelConfig, m: number): { losses: number[]; model: CausalLM } {
  const model = createModel(config, { seed: 5 });
  const trainer = new LocalTrainer(model, { lr: 3e-3, totalSteps: STEPS, warmupSteps: 3, microBatches: m });
  const task = additionTask({ seed: 2 });
  const rng = new Generator(7);
  const losses = [];
  for (let s = 0; s < STEPS; s++) losses.push(trainer.step(taskBatch(task, tok, rng, 8, 256)).loss);
  return { losses, model };
}

describe('pipeline training in one process (in-memory transport, js backend)', () => {
  setBackend('js');
  const configs = [
    gpt2Config({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, maxPositions: 32 }),
    llamaConfig({
      vocabSize: 257, hidden: 32, layers: 3, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 32, tieWordEmbeddings: false,
    }),
  ];
  const setups: { name: string; schedule: ScheduleName; cuts: [number, number][]; replicas: number; privacy: 'ends' | 'none'; m: number; recompute?: boolean }[] = [
    { name: '3 workers, GPipe', schedule: 'gpipe', cuts: [[1, 2], [2, 3], [3, 4]], replicas: 1, privacy: 'ends', m: 4 },
    { name: '3 workers, 1F1B', schedule: '1f1b', cuts: [[1, 2], [2, 3], [3, 4]], replicas: 1, privacy: 'ends', m: 4 },
    { name: '3 workers, 1F1B, recomputing activations', schedule: '1f1b', cuts: [[1, 2], [2, 3], [3, 4]], replicas: 1, privacy: 'ends', m: 4, recompute: true },
    { name: '2 stages × 2 replicas, 1F1B', schedule: '1f1b', cuts: [[1, 3], [3, 4]], replicas: 2, privacy: 'ends', m: 4 },
    { name: 'everything on 3 workers (privacy none), 1F1B', schedule: '1f1b', cuts: [[0, 2], [2, 4], [4, 6]], replicas: 1, privacy: 'none', m: 2 },
  ];
  for (const config of configs) {
    const refs = new Map<number, ReturnType<typeof reference>>();
    for (const setup of setups) {
      test(`${config.arch}: ${setup.name} trains as one process (20 AdamW steps)`, async () => {
        if (!refs.has(setup.m)) refs.set(setup.m, reference(config, setup.m));
        const ref = refs.get(setup.m)!;
        const model = createModel(config, { seed: 5 });
        const { replicas, privacy, recompute, m, schedule } = setup;
        const stages = localPipeline(model, setup.cuts, { lr: 3e-3, replicas, privacy, recompute });
        const trainer = new PipelineTrainer(stages, { lr: 3e-3, totalSteps: STEPS, warmupSteps: 3, microBatches: m, schedule });
        // bit for bit: the same sums in the same order as one process, except where replicas (or a tied head on
        // another worker) add up gradients that one process adds micro-batch by micro-batch: 1e-5 there
        const exact = setup.replicas === 1 && !(setup.privacy === 'none' && config.tieWordEmbeddings);
        const task = additionTask({ seed: 2 });
        const rng = new Generator(7);
        for (let s = 0; s < STEPS; s++) {
          const { loss } = await trainer.step(taskBatch(task, tok, rng, 8, 256));
          if (!exact) assert.ok(Math.abs(loss - ref.losses[s]) <= 1e-5 * Math.abs(ref.losses[s]), `step ${s + 1}: ${loss} vs ${ref.losses[s]}`);
          else assert.equal(loss, ref.losses[s], `step ${s + 1}`);
        }
        const weights = new Map<string, Float32Array>();
        for (const h of stages.flatMap((st) => st.replicas)) for (const [n, w] of await h.weights()) weights.set(n, w.data as Float32Array);
        const want = new Map([...ref.model.hfStateDict()].map(([n, t]) => [n, t.data as Float32Array]));
        if (exact) assert.deepEqual(weights, want);
        else assertWeightsClose(weights, want, config);
      });
    }
  }

  test('local steps: 2 stages × 2 replicas apart within a window of 4 steps, bit for bit the same after each average (and `sync`), and learning', async () => {
    const config = configs[0];
    const model = createModel(config, { seed: 5 });
    const stages = localPipeline(model, [[1, 3], [3, 4]], { lr: 3e-3, replicas: 2, localSteps: true });
    const trainer = new PipelineTrainer(stages, { lr: 3e-3, totalSteps: 12, warmupSteps: 3, microBatches: 4, syncEvery: 4 });
    const task = additionTask({ seed: 2 });
    const rng = new Generator(7);
    const replicated = stages.filter((st) => st.replicas.length === 2);
    const same = async () => {
      const verdicts = await Promise.all(replicated.map(async (st) => {
        const [a, b] = await Promise.all(st.replicas.map((h) => h.weights()));
        return [...a].every(([n, t]) => t.data.every((v, i) => v === b.get(n)!.data[i]));
      }));
      return verdicts.every(Boolean);
    };
    const losses: number[] = [];
    const together: boolean[] = [];
    for (let s = 0; s < 10; s++) {
      losses.push((await trainer.step(taskBatch(task, tok, rng, 8, 256))).loss);
      together.push(await same());
    }
    // the warm-up's first step has lr 0; averaged after steps 4 and 8 (and the schedule's last, 12); apart after every other
    assert.deepEqual(together, [true, false, false, true, false, false, false, true, false, false]);
    assert.ok(losses[9] < losses[0], `${losses}`);
    // between steps (before an evaluation or a checkpoint): averaged now
    await trainer.sync();
    assert.ok(await same());
  });

  test('local steps refuse a head tied to the embedding across replicated stages (each replica would step the tie apart)', () => {
    const model = createModel(configs[0], { seed: 5 });
    const stages = localPipeline(model, [[0, 3], [3, 6]], { lr: 3e-3, replicas: 2, privacy: 'none', localSteps: true });
    assert.throws(() => new PipelineTrainer(stages, { lr: 3e-3, totalSteps: 4, microBatches: 2, syncEvery: 2 }), {
      name: 'InvalidArgumentError', message: /tied across replicated stages/,
    });
  });
});
