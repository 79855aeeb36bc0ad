// A GPU worker in a swarm (#46): three worker processes, `worker --backend webgpu`, `--backend ort` and `--backend js`,
// serving one generation: the tokens equal one process's greedy tokens, every decoding record (sampleRate 1) re-run by
// the validator on its CPU passes within the tolerance of the worker's backend; training across them (the GPU
// worker's forwards and backwards as graphs on its GPU, its AdamW on the host) gives one process's losses and every
// record re-run passes; and a GPU worker with `--fault noise` is caught. The GPU is SwiftShader here (scripts/test.mjs
// points Vulkan at it), a real one where the machine has one.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, generate, HFTokenizer, llamaConfig, LocalTrainer } from '../../src/models/index.ts';
import { localSwarm, type LocalSwarm } from '../../src/swarm/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { listWorkers } from '../../src/user/peers.ts';
import { multiaddr } from '@multiformats/multiaddr';

// 3 blocks over 3 workers (the user keeps the ends); Llama-shaped with grouped-query attention
const config = llamaConfig({ vocabSize: 257, hidden: 64, layers: 3, heads: 4, kvHeads: 2, intermediate: 128, maxPositions: 64 });
const PROMPT = [5, 17, 42, 9, 88, 3];
const NEW = 16;

/** The backend each worker computes on, in launch order. */
const BACKENDS = ['webgpu', 'ort', 'js'] as const;

async function swarmOf(faultOnGpu: boolean): Promise<LocalSwarm> {
  return localSwarm({
    workers: 3,
    threads: 1,
    handleSignals: false,
    workerArgs: BACKENDS.map((b) => [
      '--backend', b, ...(b === 'webgpu' ? ['--gpu-memory', '1GiB'] : []), ...(b === 'webgpu' && faultOnGpu ? ['--fault', 'noise'] : []),
    ]),
  });
}

describe('a GPU worker beside a CPU worker and a js worker', () => {
  let swarm: LocalSwarm | null = null;
  before(async () => {
    setBackend('js');
    swarm = await swarmOf(false);
  });
  after(async () => {
    await swarm?.close();
  });

  test('the GPU worker announces its device: backend webgpu, the memory it lends there, GFLOP/s and bandwidth measured on it, its adapter', async () => {
    const listed = await listWorkers(swarm!.user.node, multiaddr(swarm!.bootstrap));
    const gpu = listed.find((p) => p.peerId === swarm!.workers[0].peerId)?.capabilities;
    assert.equal(gpu?.backend, 'webgpu');
    assert.equal(gpu?.memoryBytes, 2 ** 30, '--gpu-memory 1GiB: the least of the host\'s and the device\'s');
    assert.ok(gpu!.gflops > 0);
    // its adapter as the machine reports it (SwiftShader where the test runner points Vulkan at it), and its bandwidth
    const adapter = gpu?.device?.adapter ?? '';
    if (/swiftshader/i.test(process.env.VK_ICD_FILENAMES ?? '')) assert.match(adapter, /SwiftShader/);
    else assert.ok(adapter.length > 0);
    assert.ok((gpu?.device?.bandwidthGBs ?? 0) > 0, JSON.stringify(gpu?.device));
    assert.equal(listed.find((p) => p.peerId === swarm!.workers[1].peerId)?.capabilities?.device, undefined, 'a CPU worker has no device');
    const cpu = listed.find((p) => p.peerId === swarm!.workers[1].peerId)?.capabilities;
    assert.equal(cpu?.backend, 'ort');
  });

  test('one generation over webgpu, ort and js workers: one process\'s greedy tokens; every decoding record re-run passes', async () => {
    const model = createModel(config, { seed: 46 });
    const want = await generate(model, PROMPT, { maxNewTokens: NEW, temperature: 0, stopTokens: [] });
    const dm = await swarm!.user.distribute(model, { strategy: 'parameter-balanced', cacheDir: null, verify: { sampleRate: 1 } });
    try {
      assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 3, 'every worker serves a section');
      const { tokens } = await dm.generate(PROMPT, { maxNewTokens: NEW, temperature: 0, stopTokens: [] });
      assert.deepEqual(tokens, want.tokens);
      const v = dm.verification!;
      assert.deepEqual(v.flagged, [], 'no honest worker flagged');
      assert.equal(v.failed, 0);
      assert.ok(v.checked >= 3 * (NEW - 1), `${v.checked} decoding records re-run`);
      // each worker's records say what computed them
      assert.deepEqual(Object.keys(v.byBackend).sort(), ['js', 'ort', 'webgpu'], JSON.stringify(v.byBackend));
      assert.ok(dm.assignment.some((a) => a.peerId === swarm!.workers[0].peerId), 'the GPU worker serves a section');
    } finally {
      await dm.close();
    }
  });

  test('a training job over the same three workers: one process\'s losses within 1e-5; the GPU worker trains on its GPU', async () => {
    const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
    const steps = 3;
    const local = new LocalTrainer(createModel(config, { seed: 46 }), { lr: 3e-3, totalSteps: steps, microBatches: 2 });
    const task = additionTask({ seed: 2 });
    let rng = new Generator(7);
    const want = Array.from({ length: steps }, () => local.step(taskBatch(task, tok, rng, 8, 64)).loss);
    const dm = await swarm!.user.distribute(createModel(config, { seed: 46 }), { strategy: 'parameter-balanced', cacheDir: null, verify: { sampleRate: 1 } });
    try {
      const trainer = await dm.trainer({ optimizer: { lr: 3e-3 }, totalSteps: steps, microBatches: 2 });
      rng = new Generator(7);
      for (let s = 0; s < steps; s++) {
        const { loss } = await trainer.step(taskBatch(task, tok, rng, 8, 64));
        assert.ok(Math.abs(loss - want[s]) <= 1e-5 * want[s], `step ${s + 1}: ${loss} vs ${want[s]}`);
      }
      const v = dm.verification!;
      assert.deepEqual(v.flagged, [], 'no honest worker flagged');
      assert.ok(v.checked > 0 && v.failed === 0, `${v.checked} records re-run, ${v.failed} failed`);
      // training records say what computed them: the GPU worker's forwards and backwards ran as graphs on its GPU
      assert.deepEqual(Object.keys(v.byBackend).sort(), ['js', 'ort', 'webgpu'], JSON.stringify(v.byBackend));
    } finally {
      await dm.close();
    }
  });
});

describe('a GPU worker that adds noise to its outputs', () => {
  let swarm: LocalSwarm | null = null;
  before(async () => {
    setBackend('js');
    swarm = await swarmOf(true);
  });
  after(async () => {
    await swarm?.close();
  });

  test('is caught: the validator re-runs its decoding record and flags it', async () => {
    const model = createModel(config, { seed: 46 });
    const gpu = swarm!.workers[0].peerId;
    const dm = await swarm!.user.distribute(model, { strategy: 'parameter-balanced', cacheDir: null, verify: { sampleRate: 1 } });
    try {
      assert.ok(dm.assignment.some((a) => a.peerId === gpu), 'the GPU worker serves a section');
      await dm.generate(PROMPT, { maxNewTokens: 4, temperature: 0, stopTokens: [] }).catch(() => null);
      assert.ok(dm.verification!.flagged.includes(gpu), `flagged: ${dm.verification!.flagged.join(', ')}`);
    } finally {
      await dm.close();
    }
  });
});
