import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { createModel, generate, gpt2Config } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { distribute } from '../../src/user/index.ts';
import { type Running, startNode, waitFor } from '../helpers/processes.ts';
import { listWorkers } from '../../src/user/peers.ts';
import { multiaddr } from '@multiformats/multiaddr';

/**
 * Workers lost in the middle of a job, as separate processes killed with SIGKILL: the job
 * replaces them and its result is the one an undisturbed run gives (bit for bit on js).
 */
describe('failover: a lost worker is replaced and its work replayed', () => {
  setBackend('js');
  const children: Running[] = [];
  after(() => {
    for (const c of children) c.child.kill('SIGKILL');
  });
  const worker = async (boot: string, extra: string[] = []) => {
    const w = await startNode(['worker', '--bootstrap', boot, '--backend', 'js', ...extra]);
    children.push(w);
    return w;
  };

  const config = gpt2Config({ vocabSize: 64, hidden: 32, layers: 4, heads: 4, maxPositions: 128 });
  const prompt = [3, 1, 4, 1, 5, 9, 2, 6];

  test('64 tokens with the worker of a section killed at token 20: the section moves to a spare, the session replays, the tokens are the same', async () => {
    const validator = await startNode(['validator', '--backend', 'js']);
    children.push(validator);
    const boot = validator.addrs[0];
    await Promise.all([worker(boot), worker(boot)]);
    const user = await createNode();
    try {
      const model = createModel(config, { seed: 21 });
      const options = { maxNewTokens: 64, stopTokens: [], temperature: 0.8, seed: 3 };
      const expected = (await generate(model, prompt, options)).tokens;
      await waitFor('two workers', async () => (await listWorkers(user, multiaddr(boot))).length === 2, 20_000);
      const dm = await distribute(user, boot, model, { strategy: 'parameter-balanced', verify: { sampleRate: 0 } });
      assert.equal(dm.assignment.length, 2);
      // the spare joins after the plan was made
      const spare = await worker(boot);
      await waitFor('the spare to be listed', async () => (await listWorkers(user, multiaddr(boot))).length === 3, 20_000);
      const victim = children.find((c) => c.peerId === dm.assignment[1].peerId)!;
      let count = 0;
      const { tokens } = await dm.generate(prompt, {
        ...options,
        onToken: () => {
          if (++count === 20) victim.child.kill('SIGKILL');
        },
      });
      assert.deepEqual(tokens, expected);
      assert.equal(dm.failovers.length, 1, JSON.stringify(dm.failovers));
      const [event] = dm.failovers;
      assert.equal(event.peer, victim.peerId);
      assert.equal(event.action, 'spare');
      assert.deepEqual(event.replacement, [spare.peerId]);
      assert.ok(event.replayed >= 20, `the session's steps were replayed: ${event.replayed}`);
      assert.ok(event.recoveredMs !== undefined && event.recoveredMs < 30_000, `recovered in ${event.recoveredMs} ms`);
      assert.equal(dm.assignment[1].peerId, spare.peerId);
      await dm.close();
    } finally {
      await user.stop();
    }
  });
});
