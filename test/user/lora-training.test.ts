// Issue #32: LoRA adapters trained across workers. Each worker holds its section's factors beside the frozen base and
// trains only them; the job's losses and adapter are one process's (bit for bit on js), with 1F1B, over a 4-bit base,
// with replicas, and with every record re-run by the validator.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import {
  adaptModel, adapterState, byteLevelTokenizerJson, createModel, HFTokenizer, llamaConfig, loadModel, LocalTrainer, type LoraConfig,
  saveModel,
} from '../../src/models/index.ts';
import { readSafetensors } from '../../src/io/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { distribute, JobTrainer } from '../../src/user/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { parseHostSpec, startWorker } from '../../src/worker/index.ts';
import { inProcessSwarm } from '../helpers/in-process-swarm.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const STEPS = 6;
const LR = 1e-2;
const LORA: LoraConfig = { r: 4, alpha: 8, targets: ['q_proj', 'v_proj', 'o_proj', 'down_proj'] };
const SEED = 11;

/** One process: the model loaded from its folder (compact when asked), the adapter put on it, trained for STEPS steps. */
async function trainLocally(dir: string, quantize?: 'int4', seed = SEED) {
  const model = await loadModel(dir, quantize ? { quantize } : {});
  adaptModel(model, LORA, { seed });
  const trainer = new LocalTrainer(model, { lr: LR, totalSteps: STEPS, warmupSteps: 2, microBatches: 4 });
  const task = additionTask({ seed: 2 });
  const rng = new Generator(7);
  const losses: number[] = [];
  for (let s = 0; s < STEPS; s++) losses.push(trainer.step(taskBatch(task, tok, rng, 8, 256)).loss);
  return { losses, adapter: new Map([...adapterState(model)].map(([k, t]) => [k, t.data as Float32Array])) };
}

describe('LoRA across workers (js backend)', () => {
  setBackend('js');
  let dir: string;
  let net: Awaited<ReturnType<typeof inProcessSwarm>>;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'tl-lora-train-'));
    const config = llamaConfig({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, kvHeads: 2, intermediate: 64, maxPositions: 32 });
    const model = createModel(config, { seed: 5 });
    model.tokenizer = tok;
    await saveModel(model, dir);
    net = await inProcessSwarm(4);
  });
  after(async () => {
    await net?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  for (const quantize of [undefined, 'int4'] as const) {
    test(`3 workers, 1F1B${quantize ? ', a 4-bit base' : ''}, a quarter of the records re-run: one process's losses and adapter, bit for bit`, async () => {
      const ref = await trainLocally(dir, quantize);
      const dm = await distribute(net.user, net.boot, dir, {
        strategy: 'parameter-balanced', training: true, adapter: { ...LORA, seed: SEED }, verify: { sampleRate: 0.25 }, ...(quantize ? { quantize } : {}),
      });
      const out = mkdtempSync(join(tmpdir(), 'tl-lora-out-'));
      try {
        assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 3);
        const trainer = await dm.trainer({ optimizer: { lr: LR }, totalSteps: STEPS, warmupSteps: 2, microBatches: 4, schedule: '1f1b' });
        const task = additionTask({ seed: 2 });
        const rng = new Generator(7);
        for (let s = 0; s < STEPS; s++) assert.equal((await trainer.step(taskBatch(task, tok, rng, 8, 256))).loss, ref.losses[s], `step ${s + 1}`);
        // a worker holds its base once and trains only the factors: gradients and moments are the factors' size
        const held = net.workers.map((w) => w.memory.report().jobs.find((j) => j.jobId === dm.jobId)).filter((j) => j !== undefined);
        const factors = [...ref.adapter.values()].reduce((n, a) => n + 4 * a.length, 0);
        assert.equal(held.reduce((n, j) => n + j.gradients, 0), factors);
        for (const j of held) assert.equal(j.optimizer, 2 * j.gradients);
        await dm.saveAdapter(out);
        const saved = readSafetensors(join(out, 'adapter_model.safetensors'));
        assert.deepEqual([...saved.keys()].sort(), [...ref.adapter.keys()].sort());
        for (const [k, t] of saved) assert.deepEqual(t.data, ref.adapter.get(k), k);
        const summary = await dm.settle();
        assert.ok(summary && summary.checked > 0 && summary.failed === 0 && summary.flagged.length === 0, JSON.stringify(summary));
      } finally {
        await dm.close();
        rmSync(out, { recursive: true, force: true });
      }
    });
  }

  test('two users train two adapters at once over one hosted int4 base: each its job alone; each host holds one base and two adapters', async () => {
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    // two hosts of the model's blocks (0-1 and 2), held in int4 for everyone
    const host = (span: string) => startWorker({ bootstrap: boot, host: [parseHostSpec(`tiny=${dir}:${span}`)], hostFormat: 'int4' });
    const hosts = await Promise.all(['0-1', '2-2'].map(host));
    const users = await Promise.all([createNode(), createNode()]);
    const seeds = [SEED, SEED + 1];
    const refs = await Promise.all(seeds.map((seed) => trainLocally(dir, 'int4', seed)));
    const jobs: Awaited<ReturnType<typeof distribute>>[] = [];
    try {
      for (const [i, user] of users.entries()) {
        jobs.push(await distribute(user, boot, dir, { training: true, hosted: 'tiny', quantize: 'int4', adapter: { ...LORA, seed: seeds[i] }, verify: { sampleRate: 0.2 } }));
      }
      const hostIds = new Set(hosts.map((h) => h.node.peerId.toString()));
      for (const job of jobs) {
        assert.ok(job.assignment.length === 2 && job.assignment.every((a) => hostIds.has(a.peerId)), JSON.stringify(job.assignment));
      }
      const trainers: JobTrainer[] = await Promise.all(jobs.map((job) => job.trainer({ optimizer: { lr: LR }, totalSteps: STEPS, warmupSteps: 2, microBatches: 4, schedule: '1f1b' })));
      // the two jobs' steps at once, each user its own data
      const losses = await Promise.all(trainers.map(async (trainer) => {
        const task = additionTask({ seed: 2 });
        const rng = new Generator(7);
        const out: number[] = [];
        for (let s = 0; s < STEPS; s++) out.push((await trainer.step(taskBatch(task, tok, rng, 8, 256))).loss);
        return out;
      }));
      assert.deepEqual(losses[0], refs[0].losses);
      assert.deepEqual(losses[1], refs[1].losses);
      assert.notDeepEqual(losses[0], losses[1]);
      const factorBytes = refs.map((r) => [...r.adapter.values()].reduce((n, a) => n + 4 * a.length, 0));
      const held = jobs.map(() => 0);
      for (const host of hosts) {
        const report = host.memory.report();
        const base = report.jobs.filter((j) => j.jobId.startsWith('host_'));
        assert.equal(base.length, 1, 'one copy of the base');
        for (const [i, job] of jobs.entries()) {
          // a job holds its factors (and their gradients and moments), not the base
          const a = report.jobs.find((j) => j.jobId === job.jobId)!;
          assert.equal(a.gradients, a.weights);
          held[i] += a.weights;
        }
        process.stderr.write(`host …${host.node.peerId.toString().slice(-6)}: the base ${base[0].weights} bytes (int4) once; the two jobs' factors `
          + `${jobs.map((job) => report.jobs.find((j) => j.jobId === job.jobId)!.weights).join(' and ')} bytes\n`);
      }
      assert.deepEqual(held, factorBytes, 'each job holds exactly its factors over the hosts');
      for (const job of jobs) {
        const summary = await job.settle();
        assert.ok(summary && summary.failed === 0 && summary.flagged.length === 0, JSON.stringify(summary));
      }
    } finally {
      await Promise.all(jobs.map((job) => job.close()));
      await Promise.all(users.map((u) => u.stop()));
      await Promise.all(hosts.map((h) => h.stop()));
      await validator.stop();
    }
  });

  test('2 stages × 2 replicas, 1F1B (micro-batches reduced in the batch\'s order): one process\'s losses and adapter, bit for bit', async () => {
    const ref = await trainLocally(dir);
    const dm = await distribute(net.user, net.boot, dir, { strategy: 'parameter-balanced', training: true, replicas: 2, adapter: { ...LORA, seed: SEED } });
    const out = mkdtempSync(join(tmpdir(), 'tl-lora-replicas-'));
    try {
      assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 4);
      const trainer = await dm.trainer({ optimizer: { lr: LR }, totalSteps: STEPS, warmupSteps: 2, microBatches: 4, replicas: 2, schedule: '1f1b' });
      const task = additionTask({ seed: 2 });
      const rng = new Generator(7);
      for (let s = 0; s < STEPS; s++) assert.equal((await trainer.step(taskBatch(task, tok, rng, 8, 256))).loss, ref.losses[s], `step ${s + 1}`);
      // the micro-batches' gradients each replica kept for the ordered reduction were counted, and let go at the step
      for (const w of net.workers) {
        const j = w.memory.report().jobs.find((x) => x.jobId === dm.jobId);
        if (j) assert.equal(j.gradients, j.optimizer / 2, 'after the step: the gradients alone, no kept copies');
      }
      await dm.saveAdapter(out);
      for (const [k, t] of readSafetensors(join(out, 'adapter_model.safetensors'))) assert.deepEqual(t.data, ref.adapter.get(k), k);
    } finally {
      await dm.close();
      rmSync(out, { recursive: true, force: true });
    }
  });

  test('a worker lost during LoRA training: the job is rebuilt from its copy of the factors on a spare, the losses one process\'s', async (t) => {
    const ref = await trainLocally(dir);
    const own = await inProcessSwarm(4);
    const dm = await distribute(own.user, own.boot, dir, { strategy: 'parameter-balanced', training: true, adapter: { ...LORA, seed: SEED }, verify: { sampleRate: 0 } });
    try {
      const trainer = await dm.trainer({ optimizer: { lr: LR }, totalSteps: STEPS, warmupSteps: 2, microBatches: 4, schedule: '1f1b', snapshotEvery: 2 });
      const task = additionTask({ seed: 2 });
      const rng = new Generator(7);
      const losses: number[] = [];
      for (let s = 0; s < STEPS; s++) {
        if (s === 3) {
          // the worker of the last section leaves between steps: the next step finds it gone
          const victim = dm.assignment[dm.assignment.length - 1].peerId;
          await own.workers.find((w) => w.node.peerId.toString() === victim)!.stop();
        }
        losses.push((await trainer.step(taskBatch(task, tok, rng, 8, 256))).loss);
      }
      assert.deepEqual(losses, ref.losses);
      assert.ok(dm.failovers.length >= 1, 'the job failed over');
      for (const e of dm.failovers) t.diagnostic(`failover: layers ${e.layers[0]}–${e.layers[1] - 1} ${e.action}, ${e.replayed} steps replayed`);
    } finally {
      await dm.close();
      await own.stop().catch(() => {});
    }
  });
});
