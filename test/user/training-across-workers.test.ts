import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import {
  byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer, llamaConfig, LocalTrainer, type ModelConfig,
} from '../../src/models/index.ts';
import { distribute } from '../../src/user/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { inProcessSwarm } from '../helpers/in-process-swarm.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { assertWeightsClose } from '../helpers/weights.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const STEPS = 10;
const options = { lr: 3e-3, totalSteps: STEPS, warmupSteps: 3 };

interface Reference { losses: number[]; weights: Map<string, Float32Array> }
const references = new Map<string, Reference>();

/** One process's run of the job (computed once per model and micro-batch count, shared by the tests). */
function reference(config: ModelConfig, m: number): Reference {
  const key = `${config.arch}/${m}`;
  if (!references.has(key)) references.set(key, trainLocally(config, m));
  return references.get(key)!;
}

function trainLocally(config: ModelConfig, m: number): Reference {
  const model = createModel(config, { seed: 5 });
  const trainer = new LocalTrainer(model, { ...options, microBatches: m });
  const task = additionTask({ seed: 2 });
  const rng = new Generator(7);
  const losses = [];
  for (let s = 0; s < STEPS; s++) losses.push(trainer.step(taskBatch(task, tok, rng, 8, 256)).loss);
  return { losses, weights: new Map([...model.hfStateDict()].map(([n, t]) => [n, t.data as Float32Array])) };
}

const swarm = inProcessSwarm;
type Net = Awaited<ReturnType<typeof swarm>>;

/** One swarm of `workers` workers for the tests of the enclosing describe. */
function sharedSwarm(workers: number): () => Net {
  let net: Net | undefined;
  before(async () => {
    net = await swarm(workers);
  });
  after(async () => {
    await net?.stop();
  });
  return () => net!;
}

describe('distributed training over libp2p (workers on 127.0.0.1, js backend)', () => {
  setBackend('js');
  const configs = [
    gpt2Config({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, maxPositions: 32 }),
    llamaConfig({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 32 }),
  ];
  describe('3 workers', () => {
    const shared = sharedSwarm(3);
    for (const config of configs) {
      for (const schedule of ['gpipe', '1f1b'] as const) {
        test(`${config.arch}: 3 workers, ${schedule}, ${STEPS} steps: the losses and weights of one process, bit for bit`, async () => {
          const ref = reference(config, 4);
          const net = shared();
          const model = createModel(config, { seed: 5 });
          const dm = await distribute(net.user, net.boot, model, { strategy: 'parameter-balanced' });
          try {
            assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 3);
            const trainer = await dm.trainer({
              optimizer: { lr: options.lr }, totalSteps: STEPS, warmupSteps: 3, microBatches: 4, schedule,
            });
            const task = additionTask({ seed: 2 });
            const rng = new Generator(7);
            for (let s = 0; s < STEPS; s++) assert.equal((await trainer.step(taskBatch(task, tok, rng, 8, 256))).loss, ref.losses[s], `step ${s + 1}`);
            const trained = await dm.pull();
            for (const [name, t] of trained.hfStateDict()) assert.deepEqual(t.data, ref.weights.get(name), name);
          } finally {
            await dm.close();
          }
          // the job's memory is freed on every worker when it ends
          const deadline = Date.now() + 5000;
          while (net.workers.some((w) => w.stages.jobs() > 0) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
          assert.deepEqual(net.workers.map((w) => w.stages.jobs()), [0, 0, 0]);
        });
      }
    }
  });

  describe('2 stages × 2 replicas', () => {
    const shared = sharedSwarm(4);
    for (const config of configs) {
      test(`${config.arch}: 2 stages × 2 replicas (gradients reduced worker to worker): one process's losses and weights within 1e-5`, async () => {
        const ref = reference(config, 4);
        const net = shared();
        const model = createModel(config, { seed: 5 });
        const dm = await distribute(net.user, net.boot, model, { strategy: 'parameter-balanced', replicas: 2 });
        try {
          assert.deepEqual(dm.assignment.map((a) => a.replica), [0, 1, 0, 1]);
          const trainer = await dm.trainer({
            optimizer: { lr: options.lr }, totalSteps: STEPS, warmupSteps: 3, microBatches: 4, replicas: 2,
          });
          const task = additionTask({ seed: 2 });
          const rng = new Generator(7);
          for (let s = 0; s < STEPS; s++) {
            const { loss } = await trainer.step(taskBatch(task, tok, rng, 8, 256));
            assert.ok(Math.abs(loss - ref.losses[s]) <= 1e-5 * ref.losses[s], `step ${s + 1}: ${loss} vs ${ref.losses[s]}`);
          }
          const trained = await dm.pull();
          assertWeightsClose(new Map([...trained.hfStateDict()].map(([n, t]) => [n, t.data])), ref.weights, config);
        } finally {
          await dm.close();
        }
      });
    }
  });

  test('two users train two jobs at the same time on the same workers; each gets one process\'s losses, bit for bit', async () => {
    const net = await swarm(2);
    const second = await createNode();
    try {
      const runs = configs.map(async (config, i) => {
        const ref = reference(config, 2);
        const model = createModel(config, { seed: 5 });
        const dm = await distribute(i === 0 ? net.user : second, net.boot, model, { strategy: 'parameter-balanced' });
        assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 2);
        const trainer = await dm.trainer({ optimizer: { lr: options.lr }, totalSteps: STEPS, warmupSteps: 3, microBatches: 2, schedule: '1f1b' });
        const task = additionTask({ seed: 2 });
        const rng = new Generator(7);
        for (let s = 0; s < STEPS; s++) {
          assert.equal((await trainer.step(taskBatch(task, tok, rng, 8, 256))).loss, ref.losses[s], `${config.arch} step ${s + 1}`);
        }
        await dm.close();
      });
      await Promise.all(runs);
    } finally {
      await second.stop();
      await net.stop();
    }
  });

  test('a worker lost during training: with failover off the step fails with a StageFailedError naming its stage; with it on and no live worker left, one naming the lost layers', async () => {
    const config = configs[0];
    for (const failover of [false, true]) {
      const net = await swarm(2);
      try {
        const model = createModel(config, { seed: 5 });
        const dm = await distribute(net.user, net.boot, model, { strategy: 'parameter-balanced' });
        const trainer = await dm.trainer({ optimizer: { lr: 1e-3 }, totalSteps: 10, microBatches: 2, failover });
        const task = additionTask({ seed: 2 });
        const rng = new Generator(7);
        await trainer.step(taskBatch(task, tok, rng, 8, 256));
        const lost = dm.assignment[1].peerId;
        // with failover on, every worker goes: nothing is left to take the section
        for (const w of net.workers) if (failover || w.node.peerId.toString() === lost) await w.stop();
        await assert.rejects(trainer.step(taskBatch(task, tok, rng, 8, 256)), (err: Error & { details?: Record<string, unknown> }) => {
          assert.equal(err.name, 'StageFailedError');
          if (!failover) assert.equal(err.details?.stage, 2); // the user's embedding is stage 0
          else assert.match(err.message, /were lost with worker .* and no live worker could take them/);
          assert.match(err.message, new RegExp(failover ? dm.assignment.map((a) => a.peerId).join('|') : lost));
          return true;
        });
        await dm.close();
      } finally {
        await net.stop().catch(() => {});
      }
    }
  });
});
