import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createModel, generate, gpt2Config } from '../../src/models/index.ts';
import { createNode, serveControl } from '../../src/p2p/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { distribute, listPeers } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { startWorker } from '../../src/worker/index.ts';
import { waitFor } from '../helpers/processes.ts';

describe('the user side', () => {
  setBackend('js');

  test('listPeers parses the validator\'s answer record by record: a malformed one is an InvalidMessageError', async () => {
    const liar = await createNode();
    const user = await createNode();
    let answer: Record<string, unknown> = {};
    await serveControl(liar, { status: () => answer });
    try {
      const addr = liar.getMultiaddrs()[0];
      const good = { peerId: liar.peerId.toString(), roles: ['validator'], capabilities: null, addrs: [addr.toString()], proximity: {}, lastSeen: 1 };
      answer = { type: 'status', peers: [good], uptimeMs: 5 };
      assert.deepEqual(await listPeers(user, addr), [good]);
      for (const peers of [
        'everyone',
        [{ ...good, roles: ['god'] }],
        [{ ...good, peerId: '../../etc/passwd' }],
        [{ ...good, capabilities: { memoryBytes: -1, gflops: 1, tier: 'A', cores: 1, backend: 'js' } }],
        [{ ...good, addrs: Array.from({ length: 100 }, () => '/ip4/1.2.3.4/tcp/1') }],
        [{ ...good, proximity: { [good.peerId]: { rttMs: 'fast', mbps: 1, measuredAt: 1 } } }],
      ]) {
        answer = { type: 'status', peers, uptimeMs: 5 };
        await assert.rejects(listPeers(user, addr), { name: 'InvalidMessageError' }, JSON.stringify(peers).slice(0, 80));
      }
      answer = { type: 'capabilities' };
      await assert.rejects(listPeers(user, addr), { name: 'InvalidMessageError', message: /expected a status answer/ });
    } finally {
      await user.stop();
      await liar.stop();
    }
  });

  test('a stage of a distributed job moves to another worker and generation goes on with the same tokens', async () => {
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const workers = await Promise.all([startWorker({ bootstrap: boot }), startWorker({ bootstrap: boot })]);
    const user = await createNode();
    try {
      const model = createModel(gpt2Config({ vocabSize: 50, hidden: 32, layers: 4, heads: 4, maxPositions: 64 }), { seed: 9 });
      const expected = (await generate(model, [3, 1, 4, 1, 5], { maxNewTokens: 10, stopTokens: [] })).tokens;
      const dm = await distribute(user, boot, model, { strategy: 'parameter-balanced' });
      assert.equal(dm.assignment.length, 2);
      assert.deepEqual((await dm.generate([3, 1, 4, 1, 5], { maxNewTokens: 10, stopTokens: [] })).tokens, expected);
      // a third worker joins; the second section moves to it
      const spare = await startWorker({ bootstrap: boot });
      workers.push(spare);
      const moved = dm.assignment[1].peerId;
      // a worker of the same job cannot take a second section of it
      await assert.rejects(dm.replaceStage(1, 0, { peerId: dm.assignment[0].peerId, addrs: [] }), { name: 'InvalidArgumentError' });
      const old = workers.find((w) => w.node.peerId.toString() === moved)!;
      await dm.replaceStage(1, 0, { peerId: spare.node.peerId.toString(), addrs: spare.node.getMultiaddrs().map(String) });
      assert.equal(dm.assignment[1].peerId, spare.node.peerId.toString());
      await waitFor('the old worker to free the section', async () => old.stages.jobs() === 0, 10_000);
      // the chain now runs worker 1 → the spare → the user, and computes the same tokens
      assert.deepEqual((await dm.generate([3, 1, 4, 1, 5], { maxNewTokens: 10, stopTokens: [] })).tokens, expected);
      assert.ok(spare.stages.work().forwards > 0, 'the spare computed the moved section');
      await dm.close();
    } finally {
      await user.stop();
      await Promise.all(workers.map((w) => w.stop()));
      await validator.stop();
    }
  });
});
