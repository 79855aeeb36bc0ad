// Speculative decoding on a hosted model (issue #48): two users' sessions on a model hosted across two hosts, each pass
// checking the next token and its prompt-lookup drafts as one step; each host cuts its KV cache to the accepted
// positions (asked with the next step: `keep` on its forward) and signs the pass again for them. Each user's tokens are one process's,
// the hosts hold only accepted positions after every cut, and every check of the hosts passes (commitments on every
// chunk with the tails re-run, or every step re-run bit for bit). The sessions share the pages of their prompt on each host.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { generate, loadModel } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { HostedModel } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { parseHostSpec, startWorker, type Worker } from '../../src/worker/index.ts';
import { pagesIf } from '../../src/worker/kv-pages.ts';
import { readHFReference } from '../helpers/hf-fixtures.ts';

/** The KV cache lengths of the sessions a host holds whose id ends with `id` (a hosted session's id is prefixed by its user's). */
function cached(host: Worker, id: string): number[] {
  const out: number[] = [];
  for (const job of host.jobs.values()) {
    for (const [sid, s] of job.section?.sessions ?? []) if (sid.endsWith(`/${id}`)) out.push(s.cache.length);
  }
  return out;
}

describe('speculative decoding on a hosted model', () => {
  setBackend('js');

  test('two users\' sessions across two hosts: one process\'s tokens in fewer passes; the hosts keep only accepted positions; every check passes', async (t) => {
    const ref = readHFReference('llama3');
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const hosts = [await startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${ref.dir}:0-0`)] })];
    hosts.push(await startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${ref.dir}:1-1`)] }));
    // the users share one node (libp2p limits new connections from one address per second), each its own sessions
    const user = await createNode();
    try {
      const prompt = [...ref.prompt, ...ref.prompt, ...ref.prompt.slice(0, 3)];
      const options = { maxNewTokens: 40, temperature: 0, stopTokens: [] };
      const want = (await generate(await loadModel(ref.dir), prompt, options)).tokens;
      const at = validator.node.getMultiaddrs()[0];
      const verify = [{ sampleRate: 1, tailRate: 1 }, { mode: 'reexec' as const, sampleRate: 1 }];
      const models = await Promise.all(verify.map((v) => HostedModel.open(user, at, 'llama3', { ends: ref.dir, verify: v })));
      const cuts: string[] = [];
      for (const m of models) {
        m.onSession = (session) => {
          const keep = session.keep.bind(session);
          session.keep = async (length: number) => {
            await keep(length);
            cuts.push(`${length}`);
          };
          // a cut is asked with the next step: after each step the hosts hold the positions kept and the step's, no more
          const step = session.step.bind(session);
          session.step = async (...args: Parameters<typeof step>) => {
            const y = await step(...args);
            const end = (args[1].data.at(-1) as number) + 1;
            assert.deepEqual(hosts.flatMap((h) => cached(h, session.id)), [end, end], 'each host holds the accepted positions only');
            return y;
          };
        };
      }
      try {
        const outs = await Promise.all(models.map((m) => m.generateSpeculative(prompt, { ...options, draft: 'lookup' })));
        for (const [i, r] of outs.entries()) {
          assert.deepEqual(r.tokens, want, `user ${i}`);
          assert.ok(r.passes < r.tokens.length, `${r.passes} passes for ${r.tokens.length} tokens`);
          const v = models[i].verification;
          assert.equal(v.failed, 0, JSON.stringify(v));
          assert.ok(v.checked > 0, JSON.stringify(v));
          t.diagnostic(`user ${i}: ${r.tokens.length} tokens in ${r.passes} passes (${r.accepted} of ${r.drafted} drafts accepted); verification ${JSON.stringify(v)}`);
        }
        assert.ok(cuts.length > 0, 'some passes were cut');
        // the two sessions began with one prompt: the 2 full pages (32 positions) of its first step (43) were computed once
        // on each host, the second session computed only the rest
        for (const h of hosts) {
          const pages = pagesIf([...h.jobs.values()].find((j) => j.section)!.section!)!;
          assert.deepEqual({ hits: pages.prefix.counts.hits, pages: pages.prefix.size.pages }, { hits: 32, pages: 2 });
        }
      } finally {
        await Promise.all(models.map((m) => m.close()));
      }
    } finally {
      await user.stop();
      await Promise.all(hosts.map((h) => h.stop()));
      await validator.stop();
    }
  });
});
