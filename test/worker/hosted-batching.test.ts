// Issue #31: decoding steps of different users' sessions are batched on a host (continuous batching across users),
// each row with its own cache and position; each user's tokens are still one process's.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { generate, loadModel } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { HostedModel } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { parseHostSpec, startWorker } from '../../src/worker/index.ts';
import { readHFReference } from '../helpers/hf-fixtures.ts';

describe('continuous batching on a host', () => {
  setBackend('js');

  test('4 users generating at once from one host: their steps run batched, each user\'s tokens one process\'s', async () => {
    const ref = readHFReference('llama3');
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const host = await startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${ref.dir}`)] });
    // the users share one node (libp2p limits new connections from one address per second), each its own session
    const user = await createNode();
    try {
      const local = await loadModel(ref.dir);
      const options = { maxNewTokens: 20, temperature: 0, stopTokens: [] };
      const prompts = [ref.prompt, ref.prompt.slice(0, 3), ref.prompt.slice(1, 6), [...ref.prompt.slice(2), ...ref.prompt.slice(0, 2)]];
      const want: number[][] = [];
      for (const p of prompts) want.push((await generate(local, p, options)).tokens);
      const at = validator.node.getMultiaddrs()[0];
      // one user's every step is re-run by the validator: a batched step's record is its own step's, bit for bit on js
      const open = (i: number) => HostedModel.open(user, at, 'llama3', { ends: ref.dir, ...(i === 0 ? { verify: { mode: 'reexec' as const, sampleRate: 1 } } : {}) });
      const models = await Promise.all(prompts.map((_, i) => open(i)));
      try {
        const before = host.stages.work();
        const outs = await Promise.all(models.map((m, i) => m.generate(prompts[i], options)));
        outs.forEach((o, i) => assert.deepEqual(o.tokens, want[i], `user ${i}`));
        const work = host.stages.work();
        const steps = work.forwards - before.forwards;
        const batched = work.batchedRows - before.batchedRows;
        assert.ok(batched > 0, `no step ran batched (${steps} steps)`);
        process.stderr.write(`hosted batching: 4 users, ${steps} steps on the host, ${batched} of them in batches of several sessions\n`);
      } finally {
        await Promise.all(models.map((m) => m.close()));
      }
    } finally {
      await user.stop();
      await host.stop();
      await validator.stop();
    }
  });
});
