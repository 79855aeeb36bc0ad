// Issue #31 (first part): workers host spans of named models from their own disks, the validator indexes them, and
// users who hold only a model's ends generate from it by name, sharing the hosts' one loaded copy.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { generate, heldBytes, loadModel } from '../../src/models/index.ts';
import { createNode, hostedJobId, MAX_SESSIONS_PER_PEER } from '../../src/p2p/index.ts';
import { HostedModel, type HostedSession, listModels, RemoteStage } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { parseFault, parseHostSpec, startWorker, type Worker } from '../../src/worker/index.ts';
import { randn, setBackend, tensor } from '../../src/tensor/index.ts';
import { readHFReference } from '../helpers/hf-fixtures.ts';

/** A validator, hosts of the llama3 fixture (one per `spans` entry: 'FIRST-LAST', with a fault or not) and `users` user nodes. */
async function hostedSwarm(spans: (string | [string, string])[], users = 1) {
  const ref = readHFReference('llama3');
  const validator = await startValidator();
  const boot = validator.node.getMultiaddrs()[0].toString();
  const host = (span: string, fault?: string) => startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${ref.dir}:${span}`)], fault: fault ? parseFault(fault) : undefined });
  const hosts: Worker[] = [];
  for (const s of spans) hosts.push(await (typeof s === 'string' ? host(s) : host(...s)));
  const nodes = await Promise.all(Array.from({ length: users }, () => createNode()));
  const local = await loadModel(ref.dir);
  return {
    ref, validator, boot, hosts, users: nodes, local, host,
    open: (user: (typeof nodes)[number], options: Omit<Parameters<typeof HostedModel.open>[3], 'ends'> = {}) =>
      HostedModel.open(user, validator.node.getMultiaddrs()[0], 'llama3', { ends: ref.dir, ...options }),
    peerOf: (i: number) => hosts[i].node.peerId.toString(),
    async stop() {
      await Promise.all(nodes.map((u) => u.stop()));
      await Promise.all(hosts.map((h) => h.stop().catch(() => {})));
      await validator.stop();
    },
  };
}

describe('hosted models', () => {
  setBackend('js');

  test('parseHostSpec: [NAME=]PATH[:FIRST-LAST]', () => {
    assert.deepEqual(parseHostSpec('models/llama3'), { name: 'llama3', path: 'models/llama3', blocks: null });
    assert.deepEqual(parseHostSpec('tiny=/x/y.gguf:2-5'), { name: 'tiny', path: '/x/y.gguf', blocks: [2, 5] });
    assert.deepEqual(parseHostSpec('/m/q4.gguf:0-0'), { name: 'q4', path: '/m/q4.gguf', blocks: [0, 0] });
    assert.throws(() => parseHostSpec('m=/x:5-2'), /run backwards/);
  });

  test('two hosts cover a model; two users generate from it at once by name, holding only its ends, as one process does', async () => {
    const swarm = await hostedSwarm(['0-0', '1-1'], 2);
    const { ref, validator, hosts, users, local } = swarm;
    try {
      // the index: one model, both blocks online
      const { models } = await listModels(users[0], validator.node.getMultiaddrs()[0]);
      assert.equal(models.length, 1);
      const [m] = models;
      assert.equal(m.name, 'llama3');
      assert.match(m.hash, /^[0-9a-f]{64}$/);
      assert.equal(m.layers, 2);
      assert.equal(m.complete, true);
      assert.deepEqual(m.hosts.map((h) => [h.layers, h.format, h.state]).sort(), [[[0, 0], 'f32', 'online'], [[1, 1], 'f32', 'online']]);

      const options = { maxNewTokens: 16, temperature: 0, stopTokens: [] };
      const want = await generate(local, ref.prompt, options);
      const other = ref.prompt.slice(0, 3);
      const wantOther = await generate(local, other, options);
      const opened = await Promise.all(users.map((u) => swarm.open(u)));
      try {
        // the user holds its ends only
        assert.ok(heldBytes(opened[0].ends) < heldBytes(local));
        const [a, b] = await Promise.all([opened[0].generate(ref.prompt, options), opened[1].generate(other, options)]);
        assert.deepEqual(a.tokens, want.tokens);
        assert.deepEqual(b.tokens, wantOther.tokens);
        // each host holds one copy of its span whatever the sessions: its budget shows the weights once
        for (const h of hosts) {
          const jobs = h.memory.report().jobs.filter((j) => j.jobId.startsWith('host_'));
          assert.equal(jobs.length, 1);
        }
        process.stderr.write(`hosted llama3 over 2 hosts: 2 users' ${a.tokens.length} + ${b.tokens.length} tokens equal one process's\n`);
      } finally {
        await Promise.all(opened.map((o) => o.close()));
      }

      // isolation: another peer's requests reach only its own sessions; loading or closing a hosted model is refused
      const span = m.hosts.find((h) => h.layers[0] === 0)!;
      const jobId = hostedJobId({ name: m.name, hash: m.hash, layers: span.layers });
      const target = hosts.find((h) => h.node.peerId.toString() === span.peerId)!.node.getMultiaddrs()[0];
      const mine = await RemoteStage.attach(users[0], target, jobId);
      const theirs = await RemoteStage.attach(users[1], target, jobId);
      try {
        const x = randn([1, 2, local.config.hidden], { seed: 1 });
        const positions = tensor([0, 1], [1, 2], 'int32');
        await mine.forward('s1', x, positions, null);
        const status = (who: RemoteStage) => who.call({ type: 'session-status', sessionId: 's1' }, []);
        assert.equal(((await status(mine)) as { message: { position: number } }).message.position, 2);
        assert.equal(((await status(theirs)) as { message: { position: number } }).message.position, 0, 'another peer sees no session s1 of mine');
        await assert.rejects(theirs.call({ type: 'load', config: {}, section: [1, 2] }, []), { name: 'UnauthorizedError', message: /only session requests/ });
        // truncating or closing "s1" from the other peer touches only its own (absent) s1: mine keeps both positions
        await theirs.call({ type: 'truncate', sessionId: 's1', length: 0 }, []).catch(() => {});
        await theirs.closeSession('s1');
        assert.equal(((await status(mine)) as { message: { position: number } }).message.position, 2, 'my session survives the other peer\'s close');
        // the validator's requests (re-running a step) are not a user's to make
        for (const type of ['audit-index', 'audit-part']) {
          await assert.rejects(theirs.call({ type, sessionId: 's1', step: 0 }, []), { name: 'UnauthorizedError' }, type);
        }
        // one user holds at most 64 of the span's sessions: the 65th is refused, and another user still gets one
        const one = tensor([0], [1, 1], 'int32');
        const step = randn([1, 1, local.config.hidden], { seed: 2 });
        for (let i = 2; i <= MAX_SESSIONS_PER_PEER; i++) await mine.forward(`s${i}`, step, one, null);
        await assert.rejects(mine.forward('one-too-many', step, one, null), { name: 'RateLimitedError', message: /64 sessions/ });
        await theirs.forward('s1', step, one, null);
        for (let i = 1; i <= MAX_SESSIONS_PER_PEER; i++) await mine.closeSession(`s${i}`);
      } finally {
        await mine.close();
        await theirs.close();
      }
    } finally {
      await swarm.stop();
    }
  });

  test('a host lost mid-session: its blocks move to another host, their steps are replayed there, and the tokens do not change', async () => {
    const swarm = await hostedSwarm(['0-0', '1-1', '1-1']);
    const { ref, hosts, local } = swarm;
    try {
      const options = { maxNewTokens: 16, temperature: 0, stopTokens: [] };
      const want = await generate(local, ref.prompt, options);
      const model = await swarm.open(swarm.users[0]);
      let route: string[] = [];
      model.onSession = (session) => (route = session.route.map((h) => h.peerId));
      let killed: string | null = null;
      let produced = 0;
      const { tokens } = await model.generate(ref.prompt, {
        ...options,
        onToken: () => {
          // after 5 tokens the host of block 1 goes away without a word (its node stops: every connection drops)
          if (++produced !== 5) return;
          const victim = hosts.find((h) => h.node.peerId.toString() === route[1])!;
          killed = route[1];
          void victim.node.stop();
        },
      });
      assert.ok(killed, 'a host was lost');
      assert.deepEqual(tokens, want.tokens, 'the same tokens as without the failure');
      assert.equal(model.failovers.length, 1);
      assert.equal(model.failovers[0].peerId, killed);
      assert.deepEqual(model.failovers[0].layers, [1, 1]);
      process.stderr.write(`hosted llama3: block 1's host lost after 5 tokens, ${model.failovers[0].replayed} steps replayed on another; ${tokens.length} tokens equal one process's\n`);
      await model.close();
    } finally {
      await swarm.stop();
    }
  });

  test('a session keeps at most maxKeptBytes of inputs to replay: past it, each hop keeps its last step, and a host lost then ends it with a typed error', async () => {
    const swarm = await hostedSwarm(['0-0', '1-1', '1-1']);
    const { ref, hosts } = swarm;
    try {
      // 2 hops: the prompt's step, then a step a token; a limit below two steps' inputs lets the first go at once
      const model = await swarm.open(swarm.users[0], { maxKeptBytes: 1 });
      let session: HostedSession | null = null;
      model.onSession = (s) => (session = s);
      const kept: number[] = [];
      let produced = 0;
      const run = model.generate(ref.prompt, {
        maxNewTokens: 16, temperature: 0, stopTokens: [],
        onToken: async () => {
          const replay = session!.replay;
          assert.equal(replay.complete, false);
          kept.push(replay.keptBytes);
          if (++produced !== 5) return;
          // the host of block 1 goes away: with the inputs let go, nothing can be replayed on the other
          await hosts.find((h) => h.node.peerId.toString() === session!.route[1].peerId)!.node.stop();
        },
      });
      await assert.rejects(run, { name: 'PeerUnreachableError', message: /let go of the inputs it would replay on another \(past 0 MiB kept\): start it again/ });
      // from the second token on, each hop keeps one step's: a token's hidden states, position and mask
      assert.equal(new Set(kept.slice(1)).size, 1, `kept ${kept.join(', ')}`);
      assert.ok(kept[kept.length - 1] < 4096, `${kept[kept.length - 1]} bytes kept`);
      assert.equal(model.failovers.length, 0);
    } finally {
      await swarm.stop();
    }
  });

  test('a cheating host is caught by the validator re-running its steps (--verify reexec), and left out; an honest one takes its blocks', async () => {
    const swarm = await hostedSwarm(['0-0', ['1-1', 'noise:1']]);
    const { ref, validator, hosts, local } = swarm;
    try {
      const options = { maxNewTokens: 8, temperature: 0, stopTokens: [] };
      const want = await generate(local, ref.prompt, options);
      const model = await swarm.open(swarm.users[0], { verify: { mode: 'reexec', sampleRate: 1 } });
      const cheater = hosts[1].node.peerId.toString();
      // the only host of block 1 cheats: caught, left out, and then nothing covers block 1
      await assert.rejects(model.generate(ref.prompt, options), { name: 'PlanInfeasibleError', message: /hosts caught cheating are left out/ });
      assert.deepEqual(model.verification.flagged, [cheater]);
      assert.ok(model.verification.failed >= 1);
      assert.equal(validator.reputation.standing(cheater).excluded, true, 'the validator flagged it');
      // an honest host of block 1 joins: the tokens are one process's, and every step re-run passes
      hosts.push(await swarm.host('1-1'));
      const failedBefore = model.verification.failed;
      const { tokens } = await model.generate(ref.prompt, options);
      assert.deepEqual(tokens, want.tokens);
      assert.equal(model.verification.failed, failedBefore, 'the honest hosts pass');
      process.stderr.write(`hosted llama3: a noisy host caught (${model.verification.failed} failed re-runs) and left out; with an honest one, ${model.verification.checked} steps re-run, the tokens one process's\n`);
      await model.close();
    } finally {
      await swarm.stop();
    }
  });

  test('security level 2: every step runs on two routes over different hosts; a cheating route is caught when they differ and dropped, the tokens one process\'s', async () => {
    const swarm = await hostedSwarm(['0-0', '1-1', '0-0', ['1-1', 'noise:1']]);
    const { ref, local } = swarm;
    try {
      const options = { maxNewTokens: 8, temperature: 0, stopTokens: [] };
      const want = await generate(local, ref.prompt, options);
      // no sampled re-runs: only the comparison of the two routes catches the cheater
      const model = await swarm.open(swarm.users[0], { verify: { sampleRate: 0, redundancy: 2 } });
      const routes: string[][] = [];
      model.onSession = (session) => routes.push(session.route.map((h) => h.peerId));
      const { tokens } = await model.generate(ref.prompt, options);
      assert.deepEqual(tokens, want.tokens);
      assert.equal(routes.length, 2);
      assert.equal(new Set(routes.flat()).size, 4, 'the two routes share no host');
      const cheater = swarm.peerOf(3);
      assert.deepEqual(model.verification.flagged, [cheater]);
      assert.equal(model.verification.compared, 1, 'the routes disagreed at the first step; the cheating one was dropped there');
      assert.equal(swarm.validator.reputation.standing(cheater).excluded, true);
      // the cheater is left out: a second request at level 2 finds only one route
      await assert.rejects(model.generate(ref.prompt, options), { name: 'PlanInfeasibleError', message: /security level 2 needs 2 routes over different hosts/ });
      // two honest routes agree at every step
      swarm.hosts.push(await swarm.host('1-1'));
      const again = await model.generate(ref.prompt, options);
      assert.deepEqual(again.tokens, want.tokens);
      assert.equal(model.verification.compared, 1 + options.maxNewTokens, 'every step compared');
      process.stderr.write(`hosted llama3 at security level 2: a noisy route caught at its first step (${model.verification.checked} re-runs), tokens one process's\n`);
      await model.close();
    } finally {
      await swarm.stop();
    }
  });
});
