import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { GOSSIP_FRESH_MS, GossipFreshness, Registry, startValidator } from '../../src/validator/index.ts';
import { startWorker } from '../../src/worker/index.ts';
import {
  CONTROL_PROTOCOL, createLogger, createNode, encodeControl, type Frame, GRAYLIST_AFTER_REJECTS, LOG_BURST, LOG_LINES_PER_SECOND,
  MAX_CONTROL_BYTES, MAX_MESSAGES_PER_SECOND, type PeerRecord,
  parseOverview, PEERS_TOPIC, receiveFrames, request, serveControl,
} from '../../src/p2p/index.ts';
import { waitFor } from '../helpers/processes.ts';
import { PROGRESS_INTERVAL_MS, ProgressReporter } from '../../src/user/index.ts';

describe('control protocol and proximity', () => {
  test('a peer flooding the control protocol is rate limited, then served again', async () => {
    const validator = await startValidator();
    const client = await createNode();
    try {
      const stream = await client.dialProtocol(validator.node.getMultiaddrs()[0], CONTROL_PROTOCOL);
      const replies: Frame[] = [];
      receiveFrames(stream, (f) => replies.push(f));
      const n = MAX_MESSAGES_PER_SECOND * 3;
      for (let i = 0; i < n; i++) stream.send(encodeControl({ id: i + 1, type: 'status' }));
      await waitFor('all answers', async () => replies.length === n, 10_000);
      const errors = replies.filter((f) => f.kind === 'control' && (f.message as { error?: string }).error === 'RateLimitedError');
      assert.ok(errors.length > 0 && errors.length < n, `${errors.length} of ${n} refused`);
      await new Promise((r) => setTimeout(r, 1_100));
      const ok = await request(client, validator.node.getMultiaddrs()[0], { type: 'status' });
      assert.equal(ok.type, 'status');
    } finally {
      await client.stop();
      await validator.stop();
    }
  });

  test('workers measure round trip and bandwidth to each other and the validator shows it', async () => {
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const [a, b] = await Promise.all([startWorker({ bootstrap: boot }), startWorker({ bootstrap: boot })]);
    try {
      const { value } = await waitFor(
        'proximity in status',
        async () => {
          const rec = validator.peers().find((p: PeerRecord) => p.peerId === a.node.peerId.toString());
          return rec?.proximity[b.node.peerId.toString()];
        },
        20_000,
      );
      assert.ok(value.rttMs >= 0 && value.rttMs < 1000, `rtt ${value.rttMs}`);
      assert.ok(value.mbps > 0, `bandwidth ${value.mbps}`);
    } finally {
      await Promise.all([a.stop(), b.stop(), validator.stop()]);
    }
  });
});

describe('job reports and the overview (the dashboard\'s source)', () => {
  test('a user\'s reports show under its peer id; a malformed one is refused with a typed error and the validator goes on serving', async () => {
    const validator = await startValidator();
    const user = await createNode();
    const addr = validator.node.getMultiaddrs()[0];
    try {
      const report = {
        type: 'job-progress', jobId: 'j1', kind: 'train', state: 'running', stages: [{ start: 1, end: 2, peers: [user.peerId.toString()] }],
        step: 3, loss: 2.5, tokens: 300, tokensPerSecond: 50, stageSeconds: [0.1],
      };
      for (const bad of [{ ...report, step: 'three' }, { ...report, stages: 'all' }, { ...report, kind: 'mine' }]) {
        await assert.rejects(request(user, addr, bad), { name: 'InvalidMessageError' });
      }
      assert.equal((await request(user, addr, report)).type, 'ack');
      const overview = parseOverview(await request(user, addr, { type: 'overview' }));
      assert.equal(overview.validator, validator.node.peerId.toString());
      assert.equal(overview.jobs.length, 1);
      assert.equal(overview.jobs[0].owner, user.peerId.toString());
      assert.deepEqual(overview.jobs[0].history.map((p) => [p.step, p.loss]), [[3, 2.5]]);
      assert.equal((await request(user, addr, { type: 'status' })).type, 'status');
    } finally {
      await user.stop();
      await validator.stop();
    }
  });
});

describe('progress reports from a user', () => {
  test('a fast job\'s steps reach the validator a few times a second, the last one always, and the close at once', async () => {
    const validator = await startValidator();
    const user = await createNode();
    let jobId = 'job-a';
    const stages = [{ start: 1, end: 2, peers: [user.peerId.toString()] }];
    const reporter = new ProgressReporter(user, validator.node.getMultiaddrs()[0], () => ({ jobId, stages }), 'tiny');
    try {
      const t0 = Date.now();
      for (let step = 1; step <= 200; step++) {
        reporter.trained(step, 3 - step / 100, 64, 0.01, [[0.004]]);
        await new Promise((r) => setTimeout(r, 2));
      }
      const elapsed = Date.now() - t0;
      const job = await waitFor('the last step', async () => validator.overview().jobs.find((j) => j.step === 200), 5_000);
      const points = job.value.history.length;
      assert.ok(points <= elapsed / PROGRESS_INTERVAL_MS + 3, `${points} reports in ${elapsed} ms`);
      assert.equal(job.value.model, 'tiny');
      // planned again under a new id: the old one is reported closed
      jobId = 'job-b';
      reporter.trained(201, 1, 64, 0.01, [[0.004]]);
      await reporter.closed();
      const jobs = validator.overview().jobs;
      assert.deepEqual(jobs.map((j) => [j.jobId, j.state]).sort(), [['job-a', 'closed'], ['job-b', 'closed']]);
    } finally {
      await user.stop();
      await validator.stop();
    }
  });
});

describe('answers and records at their limits', () => {
  test('an answer too large for a control frame becomes an error answer, and the node goes on serving', async () => {
    const server = await createNode();
    const client = await createNode();
    await serveControl(server, { huge: () => ({ type: 'huge', pad: 'x'.repeat(MAX_CONTROL_BYTES) }), small: () => ({ type: 'small' }) });
    try {
      const addr = server.getMultiaddrs()[0];
      await assert.rejects(request(client, addr, { type: 'huge' }), { name: 'InvalidMessageError', message: /exceeds/ });
      assert.equal((await request(client, addr, { type: 'small' })).type, 'small');
    } finally {
      await client.stop();
      await server.stop();
    }
  });

  test('the registry keeps proximity only to peers it knows', () => {
    const registry = new Registry(createLogger({ level: 'silent' }));
    const link = { rttMs: 1, mbps: 100, measuredAt: 1 };
    const announce = (proximity: Record<string, typeof link>) => ({ roles: ['worker' as const], capabilities: null, addrs: [], proximity });
    registry.record('12D3KooWAAAAAAAA', announce({}));
    registry.record('12D3KooWBBBBBBBB', announce({ '12D3KooWAAAAAAAA': link, '12D3KooWmadeupid': link }));
    const b = registry.live().find((p) => p.peerId === '12D3KooWBBBBBBBB')!;
    assert.deepEqual(Object.keys(b.proximity), ['12D3KooWAAAAAAAA']);
  });
});

describe('gossip', () => {
  test('a worker that only gossips its record appears in the validator registry', async () => {
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const w = await startWorker({ bootstrap: boot, announceVia: 'gossip' });
    try {
      await waitFor(
        'the gossiped record',
        async () => validator.peers().some((p: PeerRecord) => p.peerId === w.node.peerId.toString() && p.capabilities !== null),
        15_000,
      );
    } finally {
      await w.stop();
      await validator.stop();
    }
  });
});

describe('announcements that are not what they claim', () => {
  test('gossip: a record without a time, a stale one and a replay of the last are dropped (GossipFreshness)', () => {
    let now = 1_000_000;
    const fresh = new GossipFreshness(() => now);
    const a = (at?: number) => ({ roles: ['worker' as const], capabilities: null, addrs: [], proximity: {}, ...(at === undefined ? {} : { at }) });
    assert.throws(() => fresh.check('12D3KooWAAAAAAAA', a()), /must say when/);
    assert.throws(() => fresh.check('12D3KooWAAAAAAAA', a(now - GOSSIP_FRESH_MS - 1)), /made 30 s ago/);
    assert.deepEqual(fresh.check('12D3KooWAAAAAAAA', a(now)), a(now));
    now += 2_000;
    assert.throws(() => fresh.check('12D3KooWAAAAAAAA', a(now - 2_000)), /a replay/);
    assert.deepEqual(fresh.check('12D3KooWAAAAAAAA', a(now)), a(now));
    assert.deepEqual(fresh.check('12D3KooWBBBBBBBB', a(now - 2_000)), a(now - 2_000), 'each publisher has its own clock');
  });

  test('a record is filed under the peer that sent or signed it: one naming another peer id, or gossiped stale, changes nothing', async () => {
    const lines: string[] = [];
    const validator = await startValidator({ log: createLogger({ level: 'warn', write: (l) => lines.push(l) }) });
    const boot = validator.node.getMultiaddrs()[0];
    const [liar, stale] = await Promise.all([createNode(), createNode()]);
    try {
      const victim = stale.peerId.toString();
      // a control announcement that names another peer: the validator files it under its sender
      await request(liar, boot, { type: 'announce', peerId: victim, roles: ['worker'], addrs: ['/ip4/203.0.113.9/tcp/1'], proximity: {} });
      const listed = () => validator.peers().map((p) => p.peerId);
      assert.ok(listed().includes(liar.peerId.toString()));
      assert.ok(!listed().includes(victim), 'no record for the peer it named');
      // a gossiped record made 5 minutes ago (a replay of an old one): dropped
      await stale.dial(boot);
      await waitFor('the stale peer in the validator\'s gossip mesh', async () => stale.services.pubsub.getSubscribers(PEERS_TOPIC).length > 0, 10_000);
      const old = { roles: ['worker'], addrs: [], proximity: {}, at: Date.now() - 300_000 };
      await stale.services.pubsub.publish(PEERS_TOPIC, new TextEncoder().encode(JSON.stringify(old)));
      const now = { ...old, at: Date.now() };
      await stale.services.pubsub.publish(PEERS_TOPIC, new TextEncoder().encode(JSON.stringify(now)));
      // the fresh one, published after it, is heard; the stale one before it was ignored (it may come late through an
      // honest peer: not held against the one that sent it), and is no malformed message
      await waitFor('the fresh gossiped record', async () => listed().includes(victim), 10_000);
      assert.deepEqual(validator.gossip, { accepted: 1, rejected: 0, ignored: 1, hungUp: 0 });
      assert.deepEqual(lines.filter((l) => l.includes('bad-gossip')), []);
    } finally {
      await Promise.all([liar.stop(), stale.stop()]);
      await validator.stop();
    }
  });
});

describe('a gossip flood', () => {
  test('a peer publishing malformed announcements is graylisted and hung up on: back, its well-formed one is dropped; an honest one is heard', async () => {
    const lines: string[] = [];
    const validator = await startValidator({ log: createLogger({ level: 'warn', write: (l) => lines.push(l) }) });
    const boot = validator.node.getMultiaddrs()[0];
    const [flooder, honest] = await Promise.all([createNode(), createNode()]);
    try {
      for (const n of [flooder, honest]) {
        await n.dial(boot);
        await waitFor('the validator in the publisher\'s gossip mesh', async () => n.services.pubsub.getSubscribers(PEERS_TOPIC).length > 0, 10_000);
      }
      const publish = (n: typeof flooder, body: unknown) => {
        return n.services.pubsub.publish(PEERS_TOPIC, new TextEncoder().encode(JSON.stringify(body)));
      };
      // one that claims the validator's role (the registry refuses it: it must not reach it as a throw), then malformed ones
      await publish(flooder, { roles: ['validator'], addrs: [], proximity: {}, at: Date.now() });
      for (let i = 0; i < 50; i++) await publish(flooder, { roles: ['worker'], addrs: 'not a list', proximity: {}, at: Date.now(), i });
      // gossipsub's own score of the peer (its class has it; its interface does not)
      const pubsub = validator.node.services.pubsub as unknown as { getScore(id: string): number };
      const score = () => pubsub.getScore(flooder.peerId.toString());
      await waitFor('the flooder graylisted', async () => score() < -80 && validator.gossip.rejected >= GRAYLIST_AFTER_REJECTS, 10_000);
      // those read were logged (the rest were past its rate: rejected unread), at most LOG_BURST (the logger's limit)
      const bad = lines.filter((l) => l.includes('"bad-gossip"')).length;
      assert.ok(bad >= 1 && bad <= LOG_BURST, `${bad} lines`);
      // and hung up on (its score outlives the connection: were it to come back, it would be dropped again)
      await waitFor('the flooder hung up on', async () => validator.gossip.hungUp >= 1 && flooder.getConnections(validator.node.peerId).length === 0, 10_000);
      const record = { roles: ['worker'], addrs: [], proximity: {} };
      await flooder.dial(boot);
      await publish(flooder, { ...record, at: Date.now() });
      await publish(honest, { ...record, at: Date.now() });
      const listed = () => validator.peers().map((p) => p.peerId);
      await waitFor('the honest record', async () => listed().includes(honest.peerId.toString()), 10_000);
      assert.ok(!listed().includes(flooder.peerId.toString()), 'the graylisted flooder\'s announcement is dropped');
      assert.equal(validator.gossip.accepted, 1);
    } finally {
      await Promise.all([flooder.stop(), honest.stop()]);
      await validator.stop();
    }
  });
});

describe('job ownership and logs', () => {
  test('only a job\'s owner may drive it on a worker', async () => {
    const validator = await startValidator();
    const worker = await startWorker({ bootstrap: validator.node.getMultiaddrs()[0].toString() });
    const [owner, stranger] = await Promise.all([createNode(), createNode()]);
    const addr = worker.node.getMultiaddrs()[0];
    try {
      assert.equal((await request(owner, addr, { type: 'open-job', jobId: 'job-1' })).type, 'job-opened');
      assert.equal((await request(owner, addr, { type: 'job-status', jobId: 'job-1' })).type, 'job-status');
      await assert.rejects(request(stranger, addr, { type: 'job-status', jobId: 'job-1' }), { name: 'UnauthorizedError' });
      await assert.rejects(request(stranger, addr, { type: 'close-job', jobId: 'job-1' }), { name: 'UnauthorizedError' });
      await assert.rejects(request(stranger, addr, { type: 'open-job', jobId: 'job-1' }), { name: 'UnauthorizedError' });
      await assert.rejects(request(owner, addr, { type: 'open-job', jobId: '../etc' }), { name: 'InvalidMessageError' });
      assert.equal((await request(owner, addr, { type: 'close-job', jobId: 'job-1' })).type, 'job-closed');
    } finally {
      await Promise.all([owner.stop(), stranger.stop(), worker.stop(), validator.stop()]);
    }
  });

  test('logs are structured JSON lines and quiet by default', () => {
    const lines: string[] = [];
    const quiet = createLogger({ write: (l) => lines.push(l) });
    quiet.info('peer-joined', { remote: 'x' });
    assert.equal(lines.length, 0);
    quiet.warn('announce-failed', { error: 'e' });
    const verbose = createLogger({ level: 'info', peer: 'validator', write: (l) => lines.push(l) });
    verbose.info('peer-joined', { remote: 'x' });
    const parsed = lines.map((l) => JSON.parse(l));
    assert.deepEqual(
      parsed.map((p) => [p.level, p.event]),
      [
        ['warn', 'announce-failed'],
        ['info', 'peer-joined'],
      ],
    );
    assert.equal(parsed[1].peer, 'validator');
  });

  test('an event logs at most LOG_BURST lines at once and LOG_LINES_PER_SECOND after; the next line says how many were dropped', () => {
    const lines: string[] = [];
    let now = 0;
    const log = createLogger({ write: (l) => lines.push(l), now: () => now });
    for (let i = 0; i < 1_000; i++) log.warn('bad-gossip', { i });
    log.warn('other');
    assert.equal(lines.length, LOG_BURST + 1, 'one event\'s limit leaves the others');
    now += 1_000;
    for (let i = 0; i < 1_000; i++) log.warn('bad-gossip', { i });
    const parsed = lines.slice(LOG_BURST + 1).map((l) => JSON.parse(l) as { i: number; dropped?: number });
    assert.equal(parsed.length, LOG_LINES_PER_SECOND);
    assert.deepEqual([parsed[0].i, parsed[0].dropped], [0, 1_000 - LOG_BURST]);
    assert.equal(parsed[1].dropped, undefined);
  });
});
