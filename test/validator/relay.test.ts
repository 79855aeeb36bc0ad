// The validator's relay carries what the swarm needs and no more: a pair of peers without a job or session between them
// gets what first contact takes, a pair that works together what a job's transfers take, each a budget per pair that
// refills at its rate; past it the relayed connection is cut. Real libp2p nodes on 127.0.0.1, the validator's own relay.
// (A job across two workers behind NAT, through this relay, runs in test/p2p/nat.test.ts.)
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Libp2p, Stream } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { createNode, listenAlso, request } from '../../src/p2p/index.ts';
import { startValidator, ValidatorRelayGate } from '../../src/validator/index.ts';
import { waitFor } from '../helpers/processes.ts';

const MiB = 2 ** 20;
const SINK = '/tensorlink-test/sink/1.0.0';

describe('the relay gate (its arithmetic, on a clock of its own)', () => {
  const A = '12D3KooWAAAAAAAA';
  const B = '12D3KooWBBBBBBBB';
  const C = '12D3KooWCCCCCCCC';
  const limits = {
    contactBytes: 1000, contactBytesPerSecond: 100, jobBytes: 10_000, jobBytesPerSecond: 0, contactMs: 60_000, jobMs: 600_000,
  };

  test('a pair without work between them gets its contact budget, refilled at its rate; dialling again does not renew it', () => {
    let now = 0;
    const gate = new ValidatorRelayGate(() => true, () => false, limits, () => now);
    const one = gate.circuit(A, B, '10.0.0.1');
    assert.equal(one.carry(900), null);
    assert.match(one.carry(200) ?? '', /without a job or session/);
    one.closed();
    // a second connection of the same pair finds the budget spent, and is refused until it refills
    assert.equal(gate.mayConnect(A, B, '10.0.0.1'), false);
    now += 5_000; // 500 bytes back
    assert.equal(gate.mayConnect(A, B, '10.0.0.1'), true);
    const two = gate.circuit(A, B, '10.0.0.1');
    assert.equal(two.carry(400), null);
    assert.notEqual(two.carry(200), null);
    // another pair has its own
    assert.equal(gate.circuit(A, C, '10.0.0.1').carry(900), null);
    assert.deepEqual(gate.stats().cut, { contact: 2, job: 0, duration: 0 });
  });

  test('a pair the destination says it works with gets a job\'s budget; connections last at most their time', () => {
    let now = 0;
    const works = new Set<string>();
    const gate = new ValidatorRelayGate(() => true, (a, b) => works.has(`${a} ${b}`), limits, () => now);
    const circuit = gate.circuit(A, B, null);
    assert.equal(circuit.carry(900), null);
    works.add(`${B} ${A}`); // B announced A among its peers: from here on it is a job's traffic
    assert.equal(circuit.carry(9_000), null);
    assert.match(circuit.carry(2_000) ?? '', /a job's transfers/);
    const later = gate.circuit(B, C, null);
    now += 60_001;
    assert.match(later.carry(0) ?? '', /at most 60 s/);
    assert.deepEqual(gate.stats().cut, { contact: 0, job: 1, duration: 1 });
  });

  test('a job\'s budget is sized from its destination: twice the memory it offers, between first contact\'s and jobBytes', () => {
    let now = 0;
    const offered = new Map([[A, 3_000], [B, 100], [C, 1e9]]);
    const sized = { ...limits, jobBytesPerSecond: 10 }; // jobBytes refills in 1000 s
    const gate = new ValidatorRelayGate(() => true, () => true, sized, () => now, (p) => offered.get(p) ?? null);
    const carried = (from: string, to: string) => {
      const c = gate.circuit(from, to, null);
      let n = 0;
      while (c.carry(100) === null) n += 100;
      return n;
    };
    assert.equal(carried(B, A), 6_000, 'twice what A offers');
    assert.equal(carried(A, B), 1_000, 'never less than first contact\'s');
    assert.equal(carried(A, C), 10_000, 'never more than jobBytes');
    // each refills over jobBytes' time (A's 6,000 bytes in 1000 s, 6 a second), never slower than first contact's (100)
    now += 5_000;
    assert.equal(carried(B, A), 500);
    assert.match(gate.circuit(C, A, null).carry(400) ?? '', /a job's transfers \(6000 bytes at once\)/, 'all pairs to A share its one budget');
  });

  test('only the destination\'s word makes a pair a job\'s, and all of its pairs share one job\'s budget', () => {
    const works = new Set<string>();
    const gate = new ValidatorRelayGate(() => true, (a, b) => works.has(`${a} ${b}`), limits, () => 0);
    // the source naming the destination is not enough: a peer cannot give itself a job's budget to anyone
    works.add(`${A} ${B}`);
    assert.match(gate.circuit(A, B, null).carry(2_000) ?? '', /without a job or session/);
    // a slot holder naming peers of its own: together they move one job's budget to it, not one each
    works.add(`${C} ${A}`).add(`${C} ${B}`);
    assert.equal(gate.circuit(A, C, null).carry(6_000), null);
    assert.match(gate.circuit(B, C, null).carry(6_000) ?? '', /a job's transfers/);
  });

  test('strangers are refused; slots per address and connections per peer are capped', () => {
    const known = new Set([A, B]);
    const gate = new ValidatorRelayGate((p) => known.has(p), () => false, { reservationsPerIp: 1, circuitsPerPeer: 2 });
    assert.equal(gate.mayReserve(C, '10.0.0.1'), false, 'a peer that never announced itself takes no slot');
    assert.equal(gate.mayConnect(C, A, '10.0.0.2'), false, 'nor is relayed');
    assert.equal(gate.mayReserve(A, '10.0.0.1'), true);
    assert.equal(gate.mayReserve(A, '10.0.0.1'), true, 'a slot renewed');
    assert.equal(gate.mayReserve(B, '10.0.0.1'), false, 'a second peer behind one address');
    known.delete(A);
    assert.equal(gate.mayReserve(B, '10.0.0.1'), true, 'the address\'s slot freed when its peer left');
    known.add(A);
    const open = [gate.circuit(A, B, null), gate.circuit(A, B, null)];
    assert.equal(gate.mayConnect(A, B, null), false, 'a third connection at once');
    open[0].closed();
    assert.equal(gate.mayConnect(A, B, null), true);
  });
});

/** Announces `node` to the validator as a worker (naming `peers` as the ones it works with). */
async function announce(node: Libp2p, validator: string, peers?: string[]): Promise<void> {
  await request(node, multiaddr(validator), { type: 'announce', roles: ['worker'], addrs: [], proximity: {}, ...(peers ? { peers } : {}) });
}

/** The sink's chunks: it answers one byte for each, and the sender waits for it (no two chunks in flight at once). */
const CHUNK = 64 * 1024;

/** Sends `bytes` on a relayed stream to the sink a chunk at a time until done; returns whether the relay refused or cut it. */
async function pipe(from: Libp2p, to: string, bytes: number): Promise<boolean> {
  let stream: Stream;
  try {
    stream = await from.dialProtocol(multiaddr(to), SINK, { signal: AbortSignal.timeout(10_000) });
  } catch {
    return true;
  }
  let acked = 0;
  let wake = () => {};
  stream.addEventListener('message', (evt) => {
    acked += evt.data.byteLength;
    wake();
  });
  stream.addEventListener('close', () => wake());
  try {
    for (let sent = 0; sent < bytes; sent += CHUNK) {
      stream.send(new Uint8Array(CHUNK));
      const want = sent / CHUNK + 1;
      while (acked < want) {
        if (stream.status !== 'open') return true;
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
      }
    }
    await stream.close();
    return false;
  } catch {
    return true;
  }
}

describe('the validator\'s relay', () => {
  test('a peer with no job with the destination is cut at the contact budget; one that works with it at the job\'s', async () => {
    const validator = await startValidator({
      relayLimits: { contactBytes: 1 * MiB, contactBytesPerSecond: 0, jobBytes: 4 * MiB, jobBytesPerSecond: 0 },
    });
    const boot = validator.node.getMultiaddrs()[0].toString();
    // none of them listens: they reach each other only through the relay (a direct connection learnt by identify would not
    // be the relay's to cut)
    const [target, piper, stranger] = await Promise.all([0, 1, 2].map(() => createNode({ listen: [] })));
    try {
      // what reached the target, and the sink streams that ended (the cut reaches it as a reset)
      let received = 0;
      let ended = 0;
      await target.handle(SINK, (stream) => {
        stream.addEventListener('close', () => ended++);
        let got = 0;
        stream.addEventListener('message', (evt) => {
          received += evt.data.byteLength;
          got += evt.data.byteLength;
          for (; got >= CHUNK; got -= CHUNK) stream.send(new Uint8Array(1));
        });
      });
      await announce(target, boot);
      await announce(piper, boot);
      // the target takes a slot on the validator's relay: others reach it only through it
      await listenAlso(target, `${boot}/p2p-circuit`);
      const via = `${boot}/p2p-circuit/p2p/${target.peerId.toString()}`;

      // a peer the validator never heard of is not relayed at all
      assert.equal(await pipe(stranger, via, MiB), true, 'a stranger is refused');
      assert.equal(received, 0);

      // a worker that announced itself, with no job with the target: cut within 1 MiB of 8
      assert.equal(await pipe(piper, via, 8 * MiB), true, 'the relay cut the pipe');
      await waitFor('the sink stream ended', async () => ended === 1, 10_000);
      // the relay carries whole chunks while the budget lasts (with their framing and the answers), and cuts at the one
      // that does not fit: the target got all but the last one or two chunks of the budget
      const first = validator.relay.stats();
      process.stderr.write(`relay: the target got ${received} bytes, the relay carried ${first.bytes}, before the cut (contact budget ${MiB})\n`);
      assert.ok(received <= MiB && received >= MiB - 2 * CHUNK, `${received} bytes through a contact budget of ${MiB}`);
      assert.ok(first.bytes <= MiB && first.bytes >= received, `the relay carried ${first.bytes} bytes`);
      assert.deepEqual(first.cut, { contact: 1, job: 0, duration: 0 });
      // its budget is spent: nothing more of it is relayed, on a new connection or any other one left open
      const before = received;
      assert.equal(await pipe(piper, via, MiB), true, 'a pair past its budget is refused');
      assert.equal(received, before);

      // the target says it works with the piper (a job between them): a job's budget, and a cut at its end
      await announce(target, boot, [piper.peerId.toString()]);
      received = 0;
      const endedBefore = ended;
      assert.equal(await pipe(piper, via, 8 * MiB), true, 'the relay cut the pipe at the job\'s limit');
      await waitFor('the sink stream ended', async () => ended > endedBefore, 10_000);
      const second = validator.relay.stats();
      const took = second.bytes - first.bytes;
      process.stderr.write(`relay: the target got ${received} bytes, the relay carried ${took}, before the cut (job budget ${4 * MiB})\n`);
      assert.ok(received <= 4 * MiB && received >= 4 * MiB - 2 * CHUNK, `${received} bytes through a job budget of ${4 * MiB}`);
      assert.ok(took <= 4 * MiB && took >= received, `the relay carried ${took} bytes`);
      assert.equal(second.cut.job, 1);
      assert.ok(second.cut.contact + second.refused >= 3, 'the stranger refused, and the spent pair refused or cut at once');
    } finally {
      await Promise.all([target.stop(), piper.stop(), stranger.stop()]);
      await validator.stop();
    }
  });
});
