import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { multiaddr } from '@multiformats/multiaddr';
import { launchNode, type NodeProcess } from '../src/swarm/index.ts';
import { createModel, gpt2Config, type TrainingBatch } from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { Generator, setBackend, tensor } from '../src/tensor/index.ts';
import { distribute, listWorkers } from '../src/user/index.ts';
import type { Row } from './gemm.ts';

const config = gpt2Config({ vocabSize: 4096, hidden: 256, layers: 6, heads: 8, maxPositions: 256 });
const prompt = Array.from({ length: 16 }, (_, i) => (i * 97) % 4096);

/** A validator and `n` workers on loopback, each its own process (js backend: what a failover replays is bit for bit the same). */
async function swarm(n: number) {
  const procs: NodeProcess[] = [];
  const start = async (args: string[]) => {
    const p = await launchNode([...args, '--backend', 'js'], 60_000);
    procs.push(p);
    return p;
  };
  const validator = await start(['validator']);
  const boot = validator.addrs[0];
  const workers = [];
  for (let i = 0; i < n; i++) workers.push(await start(['worker', '--bootstrap', boot, '--data', mkdtempSync(join(tmpdir(), 'tl-bench-fo-'))]));
  const user = await createNode();
  const listed = async (k: number) => {
    for (let t = 0; t < 80 && (await listWorkers(user, multiaddr(boot))).length < k; t++) await new Promise((r) => setTimeout(r, 250));
  };
  await listed(n);
  return {
    boot, workers, user, listed, start,
    close: async () => {
      await user.stop();
      for (const p of procs) p.process.kill('SIGKILL');
    },
  };
}

/**
 * Decoding 48 tokens with the worker of the last section killed at token 16: detection to the
 * next token, against one token's time in the same run; with a spare (the section moves) and
 * without (the job is planned again on the survivors).
 */
async function generation(spare: boolean): Promise<Row> {
  const net = await swarm(spare ? 2 : 3);
  try {
    const dm = await distribute(net.user, net.boot, createModel(config, { seed: 1 }), { strategy: 'parameter-balanced', verify: { sampleRate: 0 } });
    const t0 = performance.now();
    await dm.generate(prompt, { maxNewTokens: 16, stopTokens: [] });
    const perToken = (performance.now() - t0) / 16;
    if (spare) {
      await net.start(['worker', '--bootstrap', net.boot]);
      await net.listed(3);
    }
    const victim = net.workers.find((w) => w.peerId === dm.assignment.at(-1)!.peerId)!;
    let count = 0;
    await dm.generate(prompt, { maxNewTokens: 48, stopTokens: [], onToken: () => void (++count === 16 && victim.process.kill('SIGKILL')) });
    const e = dm.failovers[0];
    if (!e?.recoveredMs) throw new Error('no failover was recorded');
    await dm.close();
    return {
      section: 'failover', case: `decoding, worker killed at token 16, ${spare ? 'section moved to a spare' : 'planned again on 2 survivors'} (${e.replayed} steps replayed)`,
      value: e.recoveredMs, unit: 'ms', reference: 'one token, undisturbed', referenceValue: perToken, ratio: e.recoveredMs / perToken,
    };
  } finally {
    await net.close();
  }
}

function batchOf(rng: Generator): TrainingBatch {
  const ids = () => tensor(Int32Array.from({ length: 8 * 32 }, () => rng.int(4096)), [8, 32], 'int32');
  return { input: ids(), target: ids() };
}

/** Training: a worker killed in step 7 (copies every 5 steps): detection to the retried step done, against one step's time. */
async function training(): Promise<Row> {
  const net = await swarm(3);
  try {
    const dm = await distribute(net.user, net.boot, createModel(config, { seed: 1 }), { strategy: 'parameter-balanced', training: true, verify: { sampleRate: 0 } });
    const trainer = await dm.trainer({ optimizer: { lr: 1e-4 }, totalSteps: 100, microBatches: 4, snapshotEvery: 5 });
    const rng = new Generator(2);
    let seconds = 0;
    for (let i = 0; i < 6; i++) seconds += (await trainer.step(batchOf(rng))).seconds;
    const victim = net.workers.find((w) => w.peerId === dm.assignment.at(-1)!.peerId)!;
    const step = trainer.step(batchOf(rng));
    setTimeout(() => victim.process.kill('SIGKILL'), 20);
    await step;
    const e = dm.failovers[0];
    if (!e?.recoveredMs) throw new Error('no failover was recorded');
    await dm.close();
    const perStep = (1000 * seconds) / 6;
    return {
      section: 'failover', case: `training, worker killed in step 7, rebuilt from the copy of step 5 on 2 survivors (${e.replayed} steps replayed)`,
      value: e.recoveredMs, unit: 'ms', reference: 'one step, undisturbed', referenceValue: perStep, ratio: e.recoveredMs / perStep,
    };
  } finally {
    await net.close();
  }
}

/** Time to recover from a lost worker (GPT-2-shaped, 6 layers of width 256, js workers on loopback). */
export async function benchFailover(): Promise<Row[]> {
  setBackend('js');
  return [await generation(true), await generation(false), await training()];
}
