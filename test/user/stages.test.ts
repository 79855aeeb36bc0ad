import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  type CausalLM,
  configToHF,
  createModel,
  generate,
  generateWith,
  gpt2Config,
  llamaConfig,
  type StepModel,
} from '../../src/models/index.ts';
import { distribute, RemoteStage, tensorSource } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { startWorker } from '../../src/worker/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { noGrad, setBackend, type Tensor, tensor } from '../../src/tensor/index.ts';

const tensorOf = (ids: number[]) => tensor(ids, [1, ids.length], 'int32');

/** The user keeps the embedding and the head; the blocks run on two workers, in a chain. */
async function distributed(model: CausalLM, stages: RemoteStage[], cuts: number[], sessionId: string): Promise<StepModel> {
  const config = model.config;
  const state = model.hfStateDict();
  const total = config.layers + 3;
  const head = createModel(config, { section: [config.layers + 1, total] });
  head.loadStateDict(new Map([...head.hfStateDict().keys()].map((k) => [k, state.get(k)!])));
  const embed = createModel(config, { section: [0, 1] });
  embed.loadStateDict(new Map([...embed.hfStateDict().keys()].map((k) => [k, state.get(k)!])));
  for (let i = 0; i < stages.length; i++) {
    const part = createModel(config, { section: [cuts[i], cuts[i + 1]] });
    const weights = new Map([...part.hfStateDict().keys()].map((k) => [k, state.get(k)!]));
    await stages[i].load(configToHF(config), [cuts[i], cuts[i + 1]], tensorSource(weights));
  }
  return {
    maxPositions: config.maxPositions,
    eosTokenId: null,
    step: async (ids, options) => {
      const positions = options.positions!;
      let h: Tensor = noGrad(() => embed.forward(ids, { positions }));
      for (const s of stages) h = await s.forward(sessionId, h, positions, options.keyMask ?? null);
      return noGrad(() => head.forward(h, { positions }));
    },
  };
}

describe('distributed inference over libp2p (sections on workers)', () => {
  setBackend('js');
  for (const config of [
    gpt2Config({ vocabSize: 50, hidden: 32, layers: 4, heads: 4, maxPositions: 64 }),
    llamaConfig({ vocabSize: 50, hidden: 32, layers: 4, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 64 }),
  ]) {
    test(`${config.arch}: greedy generation across two workers equals local generation, token for token`, async () => {
      const validator = await startValidator();
      const boot = validator.node.getMultiaddrs()[0].toString();
      const workers = await Promise.all([startWorker({ bootstrap: boot }), startWorker({ bootstrap: boot })]);
      const user = await createNode();
      try {
        const model = createModel(config, { seed: 11 });
        const stages = await Promise.all(workers.map((w) => RemoteStage.open(user, w.node.getMultiaddrs()[0], 'job-a')));
        const step = await distributed(model, stages, [1, 3, config.layers + 1], 's1');
        const prompts = [[4, 8, 15, 16], [23, 42]];
        const remote = await generateWith(step, prompts, { maxNewTokens: 10, stopTokens: [] });
        for (let i = 0; i < prompts.length; i++) {
          const local = await generate(model, prompts[i], { maxNewTokens: 10, stopTokens: [] });
          assert.deepEqual(remote[i], local.tokens, `prompt ${i}`);
        }
        // another peer can neither take over this job nor use its sections from a job of its own
        const intruder = await createNode();
        await assert.rejects(RemoteStage.open(intruder, workers[0].node.getMultiaddrs()[0], 'job-a'), { name: 'UnauthorizedError' });
        const own = await RemoteStage.open(intruder, workers[0].node.getMultiaddrs()[0], 'job-b');
        const h = noGrad(() => model.forward(tensorOf([1, 2])));
        await assert.rejects(own.forward('s1', h, tensorOf([0, 1]), null), { name: 'InvalidMessageError', message: /no section loaded/ });
        await intruder.stop();
        await Promise.all(stages.map((s) => s.closeSession('s1')));
      } finally {
        await user.stop();
        await Promise.all(workers.map((w) => w.stop()));
        await validator.stop();
      }
    });
  }
});

describe('several users, vanished users', () => {
  setBackend('js');
  test('two users generate at the same time on the same workers and each gets its own tokens', async () => {
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const workers = await Promise.all([startWorker({ bootstrap: boot }), startWorker({ bootstrap: boot })]);
    const [alice, bob] = await Promise.all([createNode(), createNode()]);
    try {
      const config = gpt2Config({ vocabSize: 50, hidden: 32, layers: 4, heads: 4, maxPositions: 64 });
      const [ma, mb] = [createModel(config, { seed: 1 }), createModel(config, { seed: 2 })];
      const [da, db] = await Promise.all([
        distribute(alice, boot, ma, { strategy: 'parameter-balanced' }),
        distribute(bob, boot, mb, { strategy: 'parameter-balanced' }),
      ]);
      assert.equal(da.assignment.length, 2);
      const [ra, rb] = await Promise.all([
        da.generate([1, 2, 3], { maxNewTokens: 12, stopTokens: [] }),
        db.generate([4, 5], { maxNewTokens: 12, stopTokens: [] }),
      ]);
      assert.deepEqual(ra.tokens, (await generate(ma, [1, 2, 3], { maxNewTokens: 12, stopTokens: [] })).tokens);
      assert.deepEqual(rb.tokens, (await generate(mb, [4, 5], { maxNewTokens: 12, stopTokens: [] })).tokens);
      assert.equal(workers[0].stages.sessions(), 0, 'finished sessions are closed');
      await Promise.all([da.close(), db.close()]);
    } finally {
      await Promise.all([alice.stop(), bob.stop()]);
      await Promise.all(workers.map((w) => w.stop()));
      await validator.stop();
    }
  });

  test('the sessions of a user who vanished are freed', async () => {
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const worker = await startWorker({ bootstrap: boot });
    const user = await createNode();
    try {
      const config = gpt2Config({ vocabSize: 50, hidden: 32, layers: 2, heads: 4, maxPositions: 64 });
      const model = createModel(config, { seed: 1 });
      const stage = await RemoteStage.open(user, worker.node.getMultiaddrs()[0], 'job-v');
      const part = createModel(config, { section: [1, 3] });
      const state = model.hfStateDict();
      await stage.load(configToHF(config), [1, 3], tensorSource(new Map([...part.hfStateDict().keys()].map((k) => [k, state.get(k)!]))));
      const ctx = { positions: tensorOf([0, 1]), keyMask: null, cache: null };
      const h = noGrad(() => model.layers[0].forward(tensorOf([1, 2]), ctx));
      await stage.forward('gone', h, tensorOf([0, 1]), null);
      assert.equal(worker.stages.sessions(), 1);
      await user.stop(); // vanishes without closing its session
      // freed when its stage stream's close reaches the worker, or by the sweep of idle sessions, whichever comes first
      const swept = worker.stages.sweep(0);
      assert.ok(swept === 1 || worker.stages.jobs() === 0, `swept ${swept} sessions of a job still held`);
      assert.equal(worker.stages.sessions(), 0);
    } finally {
      await worker.stop();
      await validator.stop();
    }
  });
});

describe('logits across workers', () => {
  setBackend('js');
  for (const config of [
    gpt2Config({ vocabSize: 50, hidden: 32, layers: 4, heads: 4, maxPositions: 64 }),
    llamaConfig({ vocabSize: 50, hidden: 32, layers: 4, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 64 }),
  ]) {
    test(`${config.arch}: logits across three workers equal one process's bit for bit (js), with each strategy and privacy`, async () => {
      const validator = await startValidator();
      const boot = validator.node.getMultiaddrs()[0].toString();
      const workers = await Promise.all([0, 1, 2].map(() => startWorker({ bootstrap: boot })));
      const user = await createNode();
      try {
        const model = createModel(config, { seed: 21 });
        const ids = tensor([3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3], [2, 6], 'int32');
        const local = noGrad(() => model.forward(ids));
        for (const strategy of ['layer-aware', 'parameter-balanced', 'ring-memory-weighted'] as const) {
          for (const privacy of ['ends', 'none'] as const) {
            const dm = await distribute(user, boot, model, { strategy, privacy });
            const remote = await dm.logits(ids);
            assert.deepEqual(remote.shape, local.shape);
            assert.deepEqual(remote.data, local.data, `${strategy}, privacy ${privacy}`);
            await dm.close();
          }
        }
      } finally {
        await user.stop();
        await Promise.all(workers.map((w) => w.stop()));
        await validator.stop();
      }
    });
  }
});
