import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { multiaddr } from '@multiformats/multiaddr';
import { launchNode, type NodeProcess } from '../../src/swarm/index.ts';
import { localOptimizerState, readOptimizer, writeOptimizerStreamed } from '../../src/user/index.ts';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { readSafetensors } from '../../src/io/index.ts';
import {
  byteLevelTokenizerJson, createModel, generateBatch, gpt2Config, HFTokenizer, LocalTrainer, type TrainingBatch,
} from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { Generator, noGrad, setBackend, type Tensor, tensor } from '../../src/tensor/index.ts';
import { type DistributedJob, distribute, type JobTrainer } from '../../src/user/index.ts';
import { listWorkers } from '../../src/user/peers.ts';
import { waitFor } from '../helpers/processes.ts';

/**
 * A training job loses a worker in each phase `train` has besides its steps: while it evaluates
 * (a generation across the workers), while it writes a checkpoint, and while it pulls its weights
 * at the end. Each worker is a process of its own, killed (SIGKILL) at a known point; each time the
 * job is rebuilt from its last copy, the steps since are replayed, and what the phase returns (the
 * tokens, the checkpoint's weights and moments, the pulled weights) and every loss are those of one
 * process, bit for bit (js).
 */
describe('failover in every phase of a training job: evaluation, checkpoint, final pull (worker processes on 127.0.0.1, js)', () => {
  setBackend('js');
  const STEPS = 8;
  const options = { lr: 3e-3, totalSteps: STEPS, warmupSteps: 2, microBatches: 2 };
  const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, maxPositions: 32 });
  const task = additionTask({ seed: 2 });
  const rng = new Generator(7);
  const batches: TrainingBatch[] = Array.from({ length: STEPS }, () => taskBatch(task, tok, rng, 8, 256));
  const prompts = [[51, 43, 50, 61], [52, 43, 57, 61]]; // '3+2=', '4+9='
  const generation = { maxNewTokens: 4, stopTokens: [], temperature: 0 };
  const ids = tensor(new Int32Array([51, 43, 50, 61, 53, 10, 52, 43]), [1, 8], 'int32');

  // one process: the losses, and what each phase gives at its step
  const reference = createModel(config, { seed: 5 });
  const local = new LocalTrainer(reference, options);
  const copy = (m: Map<string, Tensor>) => new Map([...m].map(([n, t]) => [n, (t.data as Float32Array).slice()]));
  const expected = {
    losses: [] as number[],
    tokens: [] as number[][],
    logits: null as Float32Array | null,
    weights: new Map<string, Float32Array>(),
    moments: new Map<string, Float32Array>(),
    final: new Map<string, Float32Array>(),
  };
  const phases = (async () => {
    for (const [i, b] of batches.entries()) {
      expected.losses.push(local.step(b).loss);
      if (i + 1 === 4) {
        expected.tokens = (await generateBatch(reference, prompts, generation)).tokens;
        expected.logits = noGrad(() => reference.forward(ids)).data as Float32Array;
      }
      if (i + 1 === 5) {
        expected.weights = copy(reference.hfStateDict());
        expected.moments = new Map([...localOptimizerState(local)].map(([n, s]) => [n, (s.moments.data as Float32Array).slice()]));
      }
    }
    expected.final = copy(reference.hfStateDict());
  })();

  const running: NodeProcess[] = [];
  const dirs: string[] = [];
  let user: Awaited<ReturnType<typeof createNode>>;
  let dm: DistributedJob;
  let trainer: JobTrainer;
  const losses: number[] = [];
  before(async () => {
    const js = ['--backend', 'js'];
    const validator = await launchNode(['validator', ...js], 60_000);
    running.push(validator);
    const boot = validator.addrs[0];
    running.push(...await Promise.all([0, 1, 2, 3].map(() => launchNode(['worker', '--bootstrap', boot, ...js], 60_000))));
    user = await createNode();
    await waitFor('four workers', async () => (await listWorkers(user, multiaddr(boot))).length === 4, 20_000);
    dm = await distribute(user, boot, createModel(config, { seed: 5 }), { strategy: 'parameter-balanced', training: true, verify: { sampleRate: 0 } });
    // a copy every 3 steps: each failover below replays the steps since the last one
    trainer = await dm.trainer({ ...options, optimizer: { lr: options.lr }, schedule: '1f1b', snapshotEvery: 3 });
    await phases;
  });
  after(async () => {
    await dm?.close().catch(() => {});
    await user?.stop();
    for (const n of running) n.process.kill('SIGKILL');
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  /** Kills the worker that holds the job's last section now; its peer id. */
  const killLast = (): string => {
    const victim = dm.assignment[dm.assignment.length - 1].peerId;
    running.find((n) => n.peerId === victim)!.process.kill('SIGKILL');
    return victim;
  };
  const trainTo = async (step: number) => {
    while (losses.length < step) losses.push((await trainer.step(batches[losses.length])).loss);
  };
  /** The failovers since `before`: at least one, each of the lost worker, rebuilt from the last copy with the steps since replayed. */
  const newFailovers = (before: number, victim: string) => {
    const events = dm.failovers.slice(before);
    assert.ok(events.some((e) => e.peer === victim), JSON.stringify(dm.failovers));
    for (const e of events) {
      assert.equal(e.during, 'training');
      assert.ok(e.recoveredMs !== undefined, 'recovered');
      assert.ok(e.replayed <= 3, `at most the steps since the last copy were replayed: ${e.replayed}`);
    }
    return events;
  };

  test('a worker killed in the middle of an evaluation\'s generation: the job fails over, the tokens and the logits are one process\'s', async (t) => {
    await trainTo(4);
    const before = dm.failovers.length;
    let victim = '';
    let count = 0;
    const { tokens } = await dm.generateBatch(prompts, {
      ...generation,
      onToken: () => {
        if (++count === 3) victim = killLast(); // after the first token of each prompt and one more
      },
    });
    assert.deepEqual(tokens, expected.tokens);
    const [event] = newFailovers(before, victim);
    t.diagnostic(`layers ${event.layers[0]}–${event.layers[1] - 1}: ${event.replayed} step(s) replayed, back in ${event.recoveredMs} ms (${event.cause})`);
    assert.deepEqual((await dm.logits(ids)).data, expected.logits);
  });

  test('a worker killed while the checkpoint is written: the files hold one process\'s weights and moments', async (t) => {
    await trainTo(5);
    const before = dm.failovers.length;
    const dir = mkdtempSync(join(tmpdir(), 'tl-failover-checkpoint-'));
    dirs.push(dir);
    // the user's ends and the first sections are written before the dead worker's weights are asked for
    const victim = killLast();
    await dm.save(dir);
    await writeOptimizerStreamed(dir, await dm.optimizerEntries());
    const [event] = newFailovers(before, victim);
    t.diagnostic(`layers ${event.layers[0]}–${event.layers[1] - 1}: ${event.replayed} step(s) replayed, back in ${event.recoveredMs} ms (${event.cause})`);
    const saved = readSafetensors(join(dir, 'model.safetensors'));
    for (const [name, w] of expected.weights) assert.deepEqual(saved.get(name)?.data, w, name);
    const moments = readOptimizer(dir)!;
    assert.deepEqual([...moments.keys()].sort(), [...expected.moments.keys()].sort());
    for (const [name, m] of expected.moments) assert.deepEqual(moments.get(name)!.moments.data, m, name);
  });

  test('a worker killed before the final pull: the pulled weights and every loss are one process\'s', async (t) => {
    await trainTo(STEPS);
    const before = dm.failovers.length;
    const victim = killLast();
    const pulled = await dm.pull();
    const [event] = newFailovers(before, victim);
    t.diagnostic(`layers ${event.layers[0]}–${event.layers[1] - 1}: ${event.replayed} step(s) replayed, back in ${event.recoveredMs} ms (${event.cause})`);
    for (const [name, w] of expected.final) assert.deepEqual(pulled.hfStateDict().get(name)!.data, w, name);
    assert.deepEqual(losses, expected.losses);
  });
});
