// Speculative decoding across worker processes (issue #48): each pass checks the next token and its prompt-lookup
// drafts as one step through the chain of workers, which keep only the accepted positions (their KV caches cut, the
// pass's records signed again for the positions kept). Greedy, the tokens are one process's, bit for bit on js, and
// every record the validator re-runs or every chunk it checks passes; a worker killed mid-generation is failed over.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createModel, generate, llamaConfig } from '../../src/models/index.ts';
import { localSwarm, type LocalSwarm } from '../../src/swarm/index.ts';
import { setBackend } from '../../src/tensor/index.ts';

describe('speculative decoding across worker processes', () => {
  setBackend('js');
  let swarm: LocalSwarm;
  before(async () => {
    swarm = await localSwarm({ workers: 4, backend: 'js', handleSignals: false });
  });
  after(async () => {
    await swarm?.close();
  });
  const config = llamaConfig({ vocabSize: 48, hidden: 32, layers: 4, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 128 });
  /** A prompt that repeats itself (code, quotes): its n-grams come back, and drafts of them are accepted. */
  const prompt = [5, 9, 2, 33, 7, 1, 18, 4, 5, 9, 2, 33, 7, 1, 18, 4, 5, 9];
  const options = { maxNewTokens: 48, temperature: 0, stopTokens: [] };

  test('greedy over 4 workers: one process\'s tokens in fewer passes; every chunk checked and every record re-run passes', async (t) => {
    const model = createModel(config, { seed: 12 });
    const expected = (await generate(model, prompt, options)).tokens;
    // commitments on every chunk; then bitwise re-execution of every record (the passes cut short among them)
    for (const verify of [{ sampleRate: 1, chunkRate: 1 }, { sampleRate: 1, chunkRate: 0 }]) {
      const dm = await swarm.user.distribute(model, { strategy: 'parameter-balanced', verify });
      try {
        assert.equal(dm.assignment.length, 4);
        const r = await dm.generateSpeculative(prompt, { ...options, draft: 'lookup' });
        assert.deepEqual(r.tokens, expected);
        assert.ok(r.passes < r.tokens.length, `${r.passes} passes for ${r.tokens.length} tokens`);
        assert.ok(r.accepted < r.drafted, 'some drafts were rejected: the workers cut their caches');
        const v = dm.verification!;
        assert.equal(v.failed, 0, JSON.stringify(v));
        if (verify.chunkRate === 0) assert.equal(v.checked, 4 * r.passes, `every record re-run: ${JSON.stringify(v)}`);
        else assert.equal(v.chunks, 4 * 2, `every closed chunk checked: ${JSON.stringify(v)}`);
        t.diagnostic(`${r.tokens.length} tokens in ${r.passes} passes (${r.accepted} of ${r.drafted} drafts accepted); verification ${JSON.stringify(v)}`);
      } finally {
        await dm.close();
      }
    }
  });

  test('a worker killed mid-generation: the job fails over, replays the session as it was cut, and gives the same tokens', async (t) => {
    const model = createModel(config, { seed: 12 });
    const expected = (await generate(model, prompt, options)).tokens;
    const dm = await swarm.user.distribute(model, { strategy: 'parameter-balanced', verify: { sampleRate: 0 } });
    try {
      const victim = swarm.workers.find((w) => w.peerId === dm.assignment[1].peerId)!;
      let count = 0;
      const r = await dm.generateSpeculative(prompt, {
        ...options,
        draft: 'lookup',
        // the next pass waits until the worker is gone
        onToken: async () => {
          if (++count !== 12) return;
          const gone = new Promise((resolve) => victim.process.once('exit', resolve));
          victim.process.kill('SIGKILL');
          await gone;
        },
      });
      assert.deepEqual(r.tokens, expected);
      assert.equal(dm.failovers.length, 1, JSON.stringify(dm.failovers));
      assert.equal(dm.failovers[0].peer, victim.peerId);
      t.diagnostic(`${r.tokens.length} tokens in ${r.passes} passes; failover: ${dm.failovers[0].action}, ${dm.failovers[0].replayed} steps replayed`);
    } finally {
      await dm.close();
    }
  });
});
