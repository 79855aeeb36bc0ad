import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createModel, generate, gpt2Config } from '../../src/models/index.ts';
import type { Libp2p } from '@libp2p/interface';
import { createNode } from '../../src/p2p/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { distribute } from '../../src/user/index.ts';
import { alive, waitFor } from '../helpers/processes.ts';
import { hostMesh } from '../helpers/netns.ts';
import { launchNode, type NodeProcess } from '../../src/swarm/index.ts';
import { listWorkers } from '../../src/user/peers.ts';
import { multiaddr } from '@multiformats/multiaddr';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, HFTokenizer, LocalTrainer } from '../../src/models/index.ts';
import { Generator } from '../../src/tensor/index.ts';

/** A started node as these tests use it: its process, peer id and addresses. */
type Running = NodeProcess & { child: NodeProcess['process'] };

/**
 * Workers lost in the middle of a job, as separate processes on hosts of their own (Linux
 * network namespaces on one switch; the user is this process, on the switch too), killed with
 * SIGKILL: the job replaces them and its result is the one an undisturbed run gives (bit for
 * bit on js).
 */
describe('failover across hosts: a lost worker is replaced and its work replayed', () => {
  setBackend('js');
  const mesh = hostMesh(5);
  const children: Running[] = [];
  // one validator and one user for the whole file; each test kills the workers it does not keep
  let validator: Running;
  let boot: string;
  let user: Libp2p;
  before(async () => {
    validator = await start(0, ['validator']);
    boot = validator.addrs[0];
    user = await createNode({ listen: [`/ip4/${mesh.rootIp}/tcp/0`] });
  });
  after(async () => {
    await user?.stop();
    for (const c of children) c.child.kill('SIGKILL');
    mesh.remove();
  });
  const anywhere = ['--listen', '/ip4/0.0.0.0/tcp/0', '--backend', 'js'];
  /** A node on host `h` (0: the validator's; 1–4: workers'), reached at that host's address. */
  const start = async (h: number, args: string[]): Promise<Running> => {
    const n = await launchNode([...args, ...anywhere], 60_000, { prefix: mesh.hosts[h].exec });
    const routable = n.addrs.filter((a) => a.includes(`/ip4/${mesh.hosts[h].ip}/`));
    const running = { ...n, addrs: routable, child: n.process };
    children.push(running);
    return running;
  };
  let next = 0;
  /** A worker on the next of hosts 1–4 (or on host `h`: a worker restarted where it ran). */
  const worker = (extra: string[] = [], h = 1 + (next++ % 4)) => start(h, ['worker', '--bootstrap', boot, ...extra]);
  const workersNow = () => children.filter((c) => c !== validator && !c.child.killed && alive(c.child));
  const killWorkers = (keep: Running[] = []) => {
    for (const c of workersNow()) if (!keep.includes(c)) c.child.kill('SIGKILL');
  };
  /** Kills every running worker but `keep`, then waits until the validator lists exactly `keep` (it lists a killed one for 10 s). */
  const only = async (keep: Running[]) => {
    killWorkers(keep);
    const want = keep.map((k) => k.peerId).sort().join();
    const listedNow = async () => (await listWorkers(user, multiaddr(boot))).map((p) => p.peerId).sort().join();
    await waitFor(`exactly ${keep.length} workers listed`, async () => (await listedNow()) === want, 40_000);
  };
  /** Waits until the validator lists `spare` too: it joined after the plan was made. */
  const listed = (spare: Running) =>
    waitFor('the spare to be listed', async () => (await listWorkers(user, multiaddr(boot))).some((p) => p.peerId === spare.peerId), 20_000);

  const config = gpt2Config({ vocabSize: 64, hidden: 32, layers: 4, heads: 4, maxPositions: 128 });
  const prompt = [3, 1, 4, 1, 5, 9, 2, 6];

  test('a worker far slower than it announced (alive, answering) misses the step\'s deadline, is treated as lost and replaced: the same tokens', async (t) => {
    const [slow, other] = await Promise.all([worker(['--fault', 'slow']), worker()]);
    await only([slow, other]);
    const model = createModel(config, { seed: 22 });
    const options = { maxNewTokens: 8, stopTokens: [], temperature: 0 };
    const expected = (await generate(model, prompt, options)).tokens;
    const dm = await distribute(user, boot, model, { strategy: 'parameter-balanced', verify: { sampleRate: 0 } });
    try {
      assert.ok(dm.assignment.some((a) => a.peerId === slow.peerId), 'the slow worker holds a section');
      const spare = await worker();
      await listed(spare);
      const started = Date.now();
      assert.deepEqual((await dm.generate(prompt, options)).tokens, expected);
      const [event] = dm.failovers;
      assert.equal(dm.failovers.length, 1, JSON.stringify(dm.failovers));
      assert.equal(event.peer, slow.peerId);
      assert.deepEqual(event.replacement, [spare.peerId]);
      assert.ok(!dm.assignment.some((a) => a.peerId === slow.peerId));
      t.diagnostic(`lost after ${event.detectedAt - started} ms (the deadline), recovered ${event.recoveredMs} ms later: ${event.cause}`);
    } finally {
      await dm.close();
      slow.child.kill('SIGKILL');
    }
  });

  test('32 tokens with the worker of a section killed at token 12: the section moves to a spare, the session replays, the tokens are the same', async (t) => {
    // the two workers of the test before that were not slow (or new ones)
    const kept = workersNow().slice(0, 2);
    while (kept.length < 2) kept.push(await worker());
    await only(kept);
    const model = createModel(config, { seed: 21 });
    const options = { maxNewTokens: 32, stopTokens: [], temperature: 0.8, seed: 3 };
    const expected = (await generate(model, prompt, options)).tokens;
    // a worker is lost when it dies, not when it is slow (a deadline missed on a loaded machine would add a failover)
    const dm = await distribute(user, boot, model, { strategy: 'parameter-balanced', verify: { sampleRate: 0 }, deadlineFloorMs: 120_000 });
    try {
      assert.equal(dm.assignment.length, 2);
      // the spare joins after the plan was made
      const spare = await worker();
      await listed(spare);
      const victim = children.find((c) => c.peerId === dm.assignment[1].peerId)!;
      let count = 0;
      const { tokens } = await dm.generate(prompt, {
        ...options,
        onToken: () => {
          if (++count === 12) victim.child.kill('SIGKILL');
        },
      });
      assert.deepEqual(tokens, expected);
      assert.equal(dm.failovers.length, 1, JSON.stringify(dm.failovers));
      const [event] = dm.failovers;
      t.diagnostic(`failover: ${event.action} to …${event.replacement[0].slice(-6)}, ${event.replayed} steps replayed, ${event.recoveredMs} ms from detection to the next token`);
      assert.equal(event.peer, victim.peerId);
      assert.equal(event.action, 'spare');
      assert.deepEqual(event.replacement, [spare.peerId]);
      assert.ok(event.replayed >= 12, `the session's steps were replayed: ${event.replayed}`);
      assert.ok(event.recoveredMs !== undefined, 'the step after it finished');
      assert.equal(dm.assignment[1].peerId, spare.peerId);
    } finally {
      await dm.close();
    }
  });

  test('15 training steps with a worker killed every 5 steps and restarted with its identity and chunk store: the losses and weights of an undisturbed run, bit for bit', async (t) => {
    const STEPS = 15;
    const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
    const train = gpt2Config({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, maxPositions: 32 });
    const batches = () => {
      const task = additionTask({ seed: 2 });
      const rng = new Generator(7);
      return Array.from({ length: STEPS }, () => taskBatch(task, tok, rng, 8, 256));
    };
    const reference = createModel(train, { seed: 5 });
    const local = new LocalTrainer(reference, { lr: 3e-3, totalSteps: STEPS, warmupSteps: 3, microBatches: 4 });
    const expected = batches().map((b) => local.step(b).loss);

    killWorkers(); // the tests before's
    const dirs = [0, 1, 2].map(() => mkdtempSync(join(tmpdir(), 'tl-churn-')));
    const running = await Promise.all(dirs.map((d, i) => worker(['--data', d], i + 1)));
    await only(running);
    const model = createModel(train, { seed: 5 });
    const dm = await distribute(user, boot, model, { strategy: 'parameter-balanced', training: true, verify: { sampleRate: 0 }, deadlineFloorMs: 120_000 });
    try {
      const trainer = await dm.trainer({ optimizer: { lr: 3e-3 }, totalSteps: STEPS, warmupSteps: 3, microBatches: 4, schedule: '1f1b', snapshotEvery: 4 });
      const losses: number[] = [];
      let kills = 0;
      const victims: string[] = [];
      for (const [i, batch] of batches().entries()) {
        const step = trainer.step(batch);
        step.catch(() => {}); // awaited below, after the kill
        if (i > 0 && i % 5 === 0) {
          // the worker holding the job's last section dies while the step runs, and comes back with its data directory
          const victim = dm.assignment[dm.assignment.length - 1].peerId;
          victims.push(victim);
          const at = running.findIndex((r) => r.peerId === victim);
          running[at].child.kill('SIGKILL');
          kills++;
          running[at] = await worker(['--data', dirs[at]], at + 1);
          assert.equal(running[at].peerId, victim, 'it rejoins with its identity');
        }
        losses.push((await step).loss);
      }
      assert.deepEqual(losses, expected);
      const pulled = await dm.pull();
      for (const [name, t] of pulled.hfStateDict()) assert.deepEqual(t.data, reference.hfStateDict().get(name)!.data, name);
      // every kill was failed over, and nothing else (a worker is lost when it dies, not when it is slow)
      assert.equal(dm.failovers.length, kills, JSON.stringify(dm.failovers));
      assert.deepEqual(dm.failovers.map((e) => e.peer), victims);
      for (const e of dm.failovers) {
        t.diagnostic(`failover: layers ${e.layers[0]}–${e.layers[1] - 1} ${e.action} onto ${e.replacement.length} worker(s), ${e.replayed} steps replayed, ${e.recoveredMs} ms to the retried step`);
        assert.equal(e.during, 'training');
        assert.ok(e.recoveredMs !== undefined, 'the retried step finished');
        assert.ok(e.replayed >= 1 && e.replayed <= 4, `at most the steps since the last copy were replayed: ${e.replayed}`);
      }
    } finally {
      await dm.close();
    }
  });
});
