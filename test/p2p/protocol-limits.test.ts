// Every framed protocol refuses what it would never carry before it buffers it: a frame longer than the protocol's
// largest is refused at its length (control and probe frames: a few hundred KiB, not the 256 MiB a stage's tensor may
// take), a result stream from a peer that is no stage of a request waits on is reset at once, and a peer probing past
// its rate is cut off. Each time the node goes on serving. Real libp2p nodes on 127.0.0.1.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Stream } from '@libp2p/interface';
import {
  CONTROL_PROTOCOL, createNode, encodeControl, encodeTensor, MAX_RESULT_STREAMS, PROBE_BYTES, PROBE_PROTOCOL, probe, request,
  RESULT_PROTOCOL,
  sendMessage, serveControl, serveProbes, toWire,
} from '../../src/p2p/index.ts';
import { tensor } from '../../src/tensor/index.ts';
import { ResultInbox } from '../../src/user/index.ts';
import { concat } from '../helpers/bytes.ts';
import { waitFor } from '../helpers/processes.ts';

/** A frame's length prefix alone, announcing a body of `length` bytes (none of which is sent). */
function lengthOnly(length: number): Uint8Array {
  const h = new Uint8Array(5);
  new DataView(h.buffer).setUint32(0, length, true);
  h[4] = 1;
  return h;
}

/** Resolves when the stream ends (reset or closed by the other side), with how it ended. */
function ended(stream: Stream): Promise<string> {
  // a stream reset while it was being opened is ended already
  if (stream.status !== 'open') return Promise.resolve(stream.status === 'reset' || stream.status === 'aborted' ? 'reset' : 'closed');
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve('still open'), 10_000);
    stream.addEventListener('close', (evt) => {
      clearTimeout(timer);
      resolve((evt as Event & { error?: Error }).error ? 'reset' : 'closed');
    }, { once: true });
  });
}

describe('protocol limits', () => {
  test('oversized frames are refused at their length, strangers\' results at the stream, fast probers cut off; serving goes on', async () => {
    const [server, peer] = await Promise.all([createNode(), createNode()]);
    const addr = server.getMultiaddrs()[0];
    try {
      await serveControl(server, { ping: () => ({ type: 'pong' }) });
      await serveProbes(server);
      await ResultInbox.start(server);
      const open = (protocol: string) => peer.dialProtocol(addr, protocol, { signal: AbortSignal.timeout(10_000) });

      // a control frame announcing 2 MiB (a control message is at most 1 MiB): reset before any of its body is sent
      const control = await open(CONTROL_PROTOCOL);
      const controlEnd = ended(control);
      control.send(lengthOnly(2 * 2 ** 20));
      assert.equal(await controlEnd, 'reset');
      assert.equal((await request(peer, addr, { type: 'ping' })).type, 'pong', 'the next request is served');

      // a probe frame announcing 64 MiB (a probe's tensor is 256 KiB)
      const probeStream = await open(PROBE_PROTOCOL);
      const probeEnd = ended(probeStream);
      probeStream.send(lengthOnly(64 * 2 ** 20));
      assert.equal(await probeEnd, 'reset');

      // results from a peer the server waits on for nothing: reset at once, whatever it sends
      const result = await open(RESULT_PROTOCOL);
      const resultEnd = ended(result);
      if (result.status === 'open') result.send(lengthOnly(16));
      assert.equal(await resultEnd, 'reset');

      // bandwidth probes past 4 a second from one peer, sent as fast as the stream takes them: cut off (64 would take 16 s)
      const tensor = encodeTensor({ requestId: 0, dtype: 'float32', shape: [PROBE_BYTES / 4], bytes: new Uint8Array(PROBE_BYTES) });
      const flood = await open(PROBE_PROTOCOL);
      const floodEnd = ended(flood);
      const frame = concat(tensor);
      let sent = 0;
      for (; sent < 64 && flood.status === 'open'; sent++) {
        if (!flood.send(frame)) await flood.onDrain({ signal: AbortSignal.timeout(10_000) }).catch(() => {});
      }
      assert.equal(await floodEnd, 'reset');
      // a second later the peer probes again, as a worker does every 10 s
      await new Promise((resolve) => setTimeout(resolve, 1_100));
      const measured = await probe(peer, { peerId: server.peerId.toString(), addrs: [addr.toString()] });
      assert.ok(measured.mbps > 0 && measured.rttMs >= 0, `probed again: ${JSON.stringify(measured)}`);
      assert.equal((await request(peer, addr, { type: 'ping' })).type, 'pong');
    } finally {
      await Promise.all([server.stop(), peer.stop()]);
    }
  });

  test('a stage that closes its result streams is never refused for streams it no longer has (the inbox closes its side too)', async () => {
    const [user, stage] = await Promise.all([createNode(), createNode()]);
    const addr = user.getMultiaddrs()[0];
    try {
      const inbox = await ResultInbox.start(user);
      inbox.expect(new Set([stage.peerId.toString()]), 60_000).result.catch(() => {});
      // more streams, one after another, than a connection may hold at once (MAX_RESULT_STREAMS): each closed by the
      // stage, and by the inbox in turn (a close waits for the other side's)
      for (let i = 0; i < MAX_RESULT_STREAMS + 16; i++) {
        const stream = await stage.dialProtocol(addr, RESULT_PROTOCOL, { signal: AbortSignal.timeout(10_000) });
        assert.equal(stream.status, 'open', `stream ${i} taken`);
        await stream.close({ signal: AbortSignal.timeout(5_000) });
      }
      const left = () => user.getConnections(stage.peerId)
        .reduce((n, c) => n + c.streams.filter((x) => x.protocol === RESULT_PROTOCOL).length, 0);
      await waitFor('no result stream left open', async () => left() === 0, 5_000);
    } finally {
      await Promise.all([user.stop(), stage.stop()]);
    }
  });

  test('a stage of an earlier chain, no request of it pending, opens a result stream: kept, and the next request\'s result on it arrives', async () => {
    const [user, stage] = await Promise.all([createNode(), createNode()]);
    const addr = user.getMultiaddrs()[0];
    try {
      const inbox = await ResultInbox.start(user);
      const from = new Set([stage.peerId.toString()]);
      // a request that failed (here: its deadline passed) while its stage was still at work
      const first = inbox.expect(from, 50);
      await assert.rejects(first.result, { name: 'PeerUnreachableError' });
      // the stage answers late, on a stream of its own: the inbox waits on nothing from it, and does not reset it
      const stream = await stage.dialProtocol(addr, RESULT_PROTOCOL, { signal: AbortSignal.timeout(10_000) });
      const end = ended(stream);
      await sendMessage(stream, [encodeControl({ type: 'records', id: first.requestId, records: [] })]);
      // the next request's result goes on the same stream, as a worker's cached stream carries it
      const next = inbox.expect(from, 10_000);
      const [head, payload] = encodeTensor(toWire(tensor([1, 2, 3], [1, 3]), next.requestId));
      await sendMessage(stream, [encodeControl({ type: 'records', id: next.requestId, records: ['r'] }), head, payload]);
      const got = await next.result;
      assert.deepEqual([...got.output.data], [1, 2, 3]);
      assert.deepEqual(got.records, ['r']);
      assert.equal(await Promise.race([end, new Promise((r) => setTimeout(() => r('open'), 300))]), 'open');
    } finally {
      await Promise.all([user.stop(), stage.stop()]);
    }
  });
});
