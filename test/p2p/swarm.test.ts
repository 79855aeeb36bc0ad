import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { multiaddr } from '@multiformats/multiaddr';
import {
  CONTROL_PROTOCOL, createNode, encodeControl, encodeTensor, type PeerRecord, request, type TensorLinkNode,
} from '../../src/p2p/index.ts';
import { Generator } from '../../src/tensor/index.ts';
import { alive, type Running, startNode, waitFor } from '../helpers/processes.ts';

describe('a swarm of separate processes on 127.0.0.1', () => {
  const root = mkdtempSync(join(tmpdir(), 'tl-swarm-'));
  const running: Running[] = [];
  let client: TensorLinkNode;
  after(async () => {
    for (const r of running) if (alive(r.child)) r.child.kill('SIGKILL');
    await client?.stop();
  });

  const workers = async (validator: Running) => {
    const reply = await request(client, multiaddr(validator.addrs[0]), { type: 'status' }, 5_000);
    return (reply.peers as PeerRecord[]).filter((p) => p.roles.includes('worker'));
  };

  test('status lists three workers within 10 s; a killed worker drops out; a restarted one keeps its peer id', async () => {
    client = await createNode();
    const validator = await startNode(['validator', '--data', join(root, 'v')]);
    running.push(validator);
    const boot = validator.addrs[0];
    const ws = await Promise.all([0, 1, 2].map((i) => startNode(['worker', '--bootstrap', boot, '--memory', '1GiB', '--data', join(root, `w${i}`)])));
    running.push(...ws);
    const listed = await waitFor('three workers', async () => (await workers(validator)).length === 3 && (await workers(validator)), 10_000);
    for (const w of listed.value) {
      assert.equal(w.capabilities?.memoryBytes, 2 ** 30);
      assert.ok((w.capabilities?.gflops ?? 0) > 0 && ['A', 'B', 'C'].includes(w.capabilities!.tier));
    }
    ws[0].child.kill('SIGKILL');
    const gone = await waitFor('the killed worker to drop out', async () => !(await workers(validator)).some((w) => w.peerId === ws[0].peerId), 30_000);
    assert.ok(gone.ms <= 30_000);
    const again = await startNode(['worker', '--bootstrap', boot, '--data', join(root, 'w0')]);
    running.push(again);
    assert.equal(again.peerId, ws[0].peerId);
    await waitFor('the restarted worker', async () => (await workers(validator)).some((w) => w.peerId === again.peerId), 10_000);
  });

  test('10,000 malformed frames and messages leave the validator and a worker serving', async () => {
    const validator = running[0];
    const worker = running[2]; // running[1] is the worker killed above
    const rng = new Generator(7);
    const garbage = (i: number): Uint8Array => {
      switch (i % 5) {
        case 0:
          return Uint8Array.from({ length: 1 + rng.int(64) }, () => rng.int(256));
        case 1:
          return encodeControl({ id: i, type: ['announce', 'status', 'frob', 'capabilities'][rng.int(4)], roles: rng.int(2) ? ['validator'] : 7 });
        case 2:
          return encodeControl([i, 'not an object']);
        case 3: {
          const parts = encodeTensor({ requestId: i, dtype: 'float32', shape: [2], bytes: new Uint8Array(8) });
          return Uint8Array.from([...parts[0], ...parts[1]]);
        }
        default: {
          const f = encodeControl({ id: i, type: 'announce', roles: ['worker'], capabilities: { tier: 'Z' } });
          return f.subarray(0, 1 + rng.int(f.length - 1));
        }
      }
    };
    for (const target of [validator, worker]) {
      const addr = multiaddr(target.addrs[0]);
      let sent = 0;
      while (sent < 5_000) {
        const stream = await client.dialProtocol(addr, CONTROL_PROTOCOL);
        for (let k = 0; k < 100; k++) {
          try {
            stream.send(garbage(sent++));
          } catch {
            break; // the peer reset this stream: expected for garbage
          }
        }
        stream.abort(new Error('done'));
      }
    }
    assert.ok(alive(validator.child) && alive(worker.child));
    await new Promise((r) => setTimeout(r, 1_100)); // let this client's rate limit refill
    assert.ok((await workers(validator)).length >= 2, 'the validator still answers status');
    const caps = await request(client, multiaddr(worker.addrs[0]), { type: 'capabilities' }, 5_000);
    assert.equal(caps.type, 'capabilities');
  });
});
