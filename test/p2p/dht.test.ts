import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { startValidator } from '../../src/validator/index.ts';
import { startWorker } from '../../src/worker/index.ts';

describe('discovery', () => {
  test('two workers that know only the validator find each other through the DHT', async () => {
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const [a, b] = await Promise.all([startWorker({ bootstrap: boot }), startWorker({ bootstrap: boot })]);
    try {
      assert.equal(a.node.getConnections(b.node.peerId).length, 0, 'not connected before the lookup');
      const found = await a.node.peerRouting.findPeer(b.node.peerId, { signal: AbortSignal.timeout(15_000) });
      assert.equal(found.id.toString(), b.node.peerId.toString());
      const ports = b.node.getMultiaddrs().map((m) => m.toString().split('/')[4]);
      assert.ok(found.multiaddrs.some((m) => ports.includes(m.toString().split('/')[4])), 'the DHT returned a reachable address');
      await a.node.services.ping.ping(found.multiaddrs[0]);
    } finally {
      await Promise.all([a.stop(), b.stop(), validator.stop()]);
    }
  });
});
