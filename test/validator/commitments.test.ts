// Activation commitments (#47): hosts commit to every chunk of 32 positions they compute (TOPLOC's 258 bytes per row
// and chunk); the validator checks sampled chunks by one prefill of the host's blocks over the session, with the
// weights the host announced, and no weights move after the first check of a span. A host that computes with a cheaper
// model than it announces (int4 matrices, or another seed's weights) is caught within its first sampled chunks; the
// honest hosts never are; with the cheater left out the tokens are one process's.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createModel, generate, llamaConfig, loadModel } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { ortAvailable, setBackend } from '../../src/tensor/index.ts';
import { distribute, HostedModel } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { parseFault, parseHostSpec, startWorker, type Worker } from '../../src/worker/index.ts';
import { readHFReference } from '../helpers/hf-fixtures.ts';

const ref = readHFReference('llama3');
/** 40 new tokens after the fixture's prompt: the session passes position 31, so each host closes chunk 0. */
const options = { maxNewTokens: 40, temperature: 0, stopTokens: [] };

describe('activation commitments on onnxruntime: a host computing with another model than it announces is caught', { skip: ortAvailable() ? false : 'onnxruntime does not load on this machine' }, () => {
  for (const fault of ['substitute:int4', 'substitute:other']) {
    test(`--fault ${fault}: flagged within its first sampled chunks; no honest host flagged; with an honest host the tokens are one process's`, async () => {
      setBackend('ort', { threads: 1 });
      const validator = await startValidator();
      const boot = validator.node.getMultiaddrs()[0].toString();
      const host = (span: string, f?: string) => startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${ref.dir}:${span}`)], ...(f ? { fault: parseFault(f) } : {}) });
      const hosts: Worker[] = [await host('0-0'), await host('1-1', fault)];
      const user = await createNode();
      try {
        const local = await loadModel(ref.dir);
        const want = await generate(local, ref.prompt, options);
        // every committed chunk checked, no step re-run: the test does not depend on which ones a random draw picks
        const model = await HostedModel.open(user, validator.node.getMultiaddrs()[0], 'llama3', { ends: ref.dir, verify: { sampleRate: 1, tailRate: 0 } });
        const cheater = hosts[1].node.peerId.toString();
        // the only host of block 1 cheats: caught when the session's chunks are checked, left out, and nothing covers block 1
        await assert.rejects(model.generate(ref.prompt, options), { name: 'PlanInfeasibleError', message: /hosts caught cheating are left out/ });
        assert.deepEqual(model.verification.flagged, [cheater]);
        assert.ok(model.verification.chunks <= 10, `${model.verification.chunks} chunks checked before it was caught`);
        assert.equal(validator.reputation.standing(cheater).excluded, true);
        // caught by its commitments: the weights it hands over are the ones it announced (the cheat keeps them aside)
        const failedCheck = validator.overview().events.find((e) => e.kind === 'check-failed');
        assert.match(failedCheck?.detail ?? '', /chunk 0 \(positions 0-31\), row 0: \d+ of 128 values differ in sign or exponent/);
        process.stderr.write(`commitments: the validator's log: ${failedCheck?.detail}\n`);
        // an honest host of block 1 joins: one process's tokens, every chunk checked passes
        hosts.push(await host('1-1'));
        const failed = model.verification.failed;
        const checked = model.verification.checked;
        const { tokens } = await model.generate(ref.prompt, options);
        assert.deepEqual(tokens, want.tokens);
        assert.equal(model.verification.failed, failed, 'the honest hosts pass');
        assert.equal(model.verification.checked, checked + 2, 'one check per host and session');
        for (const h of [hosts[0], hosts[2]]) assert.notEqual(validator.reputation.standing(h.node.peerId.toString()).excluded, true);
        process.stderr.write(`commitments: --fault ${fault} caught (${model.verification.failed} failed check), ${model.verification.chunks} chunks checked in all\n`);
        await model.close();
      } finally {
        await user.stop();
        await Promise.all(hosts.map((h) => h.stop().catch(() => {})));
        await validator.stop();
        setBackend('js');
      }
    });
  }
});

describe('activation commitments in a private job\'s generation (ort)', { skip: ortAvailable() ? false : 'onnxruntime does not load on this machine' }, () => {
  test('a worker adding noise of 1e-3 to its outputs is caught by the chunks it commits to (no step re-run); the job is planned again without it and the tokens are one process\'s', async () => {
    setBackend('ort', { threads: 1 });
    const config = llamaConfig({ vocabSize: 257, hidden: 64, layers: 3, heads: 4, kvHeads: 2, intermediate: 128, maxPositions: 64 });
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const workers: Worker[] = [];
    // three workers for three blocks: the plan puts a section on each, the cheater's included (no race on which are picked)
    for (let i = 0; i < 3; i++) workers.push(await startWorker({ bootstrap: boot, ...(i === 1 ? { fault: parseFault('noise') } : {}) }));
    const user = await createNode();
    try {
      const prompt = [5, 17, 42, 9, 88, 3];
      const jobOptions = { maxNewTokens: 40, temperature: 0, stopTokens: [] };
      const want = await generate(createModel(config, { seed: 47 }), prompt, jobOptions);
      // commitments alone: every chunk checked, no decoding step re-run
      const dm = await distribute(user, boot, createModel(config, { seed: 47 }), { strategy: 'parameter-balanced', cacheDir: null, verify: { sampleRate: 0, chunkRate: 1 } });
      const cheater = workers[1].node.peerId.toString();
      assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 3, 'every worker holds a section');
      const { tokens } = await dm.generate(prompt, jobOptions);
      assert.deepEqual(tokens, want.tokens);
      const v = dm.verification!;
      assert.deepEqual(v.flagged, [cheater]);
      assert.ok(v.chunks >= 1 && v.replayedSteps > 0, JSON.stringify(v));
      assert.ok(!dm.assignment.some((a) => a.peerId === cheater));
      const failedCheck = validator.overview().events.find((e) => e.kind === 'check-failed');
      assert.match(failedCheck?.detail ?? '', /chunk 0 \(positions 0-31\)/);
      process.stderr.write(`commitments in a job: noise 1e-3 caught: ${failedCheck?.detail}\n`);
      await dm.close();
    } finally {
      await user.stop();
      await Promise.all(workers.map((w) => w.stop()));
      await validator.stop();
      setBackend('js');
    }
  });
});
