import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { multiaddr } from '@multiformats/multiaddr';
import { localSwarm } from '../../src/swarm/index.ts';
import { createModel, generate, gpt2Config, saveModel } from '../../src/models/index.ts';
import { parseStatsAnswer, request } from '../../src/p2p/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { distribute, listWorkers } from '../../src/user/index.ts';
import { waitFor } from '../helpers/processes.ts';

/** 8 blocks of 3 MiB: 25 MiB in all, more than any one worker below offers. */
const config = gpt2Config({ vocabSize: 256, hidden: 256, layers: 8, heads: 4, maxPositions: 64 });
const MEMORY = 12 * 1024 ** 2;

describe('workers that hold the checkpoint, each too small for the model', () => {
  test('three workers of 12 MiB run a 25 MiB model from their own --models copies: no weight byte moves, the tokens equal one process', async () => {
    setBackend('js');
    const root = mkdtempSync(join(tmpdir(), 'tl-models-'));
    const dir = join(root, 'gpt2-small');
    const model = createModel(config, { seed: 5 });
    await saveModel(model, dir);
    assert.ok(4 * model.numParameters() > MEMORY, 'no single worker can hold the model');
    const expected = (await generate(model, [5, 6, 7], { maxNewTokens: 8, temperature: 0, stopTokens: [] })).tokens;
    const swarm = await localSwarm({ workers: 3, backend: 'js', memory: `${MEMORY}B`, models: root, handleSignals: false });
    const node = swarm.user.node;
    try {
      let sent = 0;
      const dm = await distribute(node, swarm.bootstrap, dir, { onProgress: (_, p) => (sent = Math.max(sent, p.sent)) });
      assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 3, 'the plan needs all three workers');
      assert.deepEqual((await dm.generate([5, 6, 7], { maxNewTokens: 8, temperature: 0, stopTokens: [] })).tokens, expected);
      assert.equal(sent, 0, 'the user sent no chunk');
      for (const w of swarm.workers) {
        const stats = parseStatsAnswer(await request(node, { peerId: w.peerId, addrs: w.addrs }, { type: 'stats' }));
        assert.equal(stats.work.weightBytesReceived, 0, `worker ${w.peerId} received no weight bytes`);
        assert.ok(stats.work.weightBytesReused > 0, 'it read its section from its own copy');
        assert.ok(stats.memory.used > 0 && stats.memory.used + stats.memory.free === MEMORY, 'its budget counts the section');
      }
      // status shows what is used and free
      await waitFor('the workers to announce their memory in use', async () => {
        const workers = await listWorkers(node, multiaddr(swarm.bootstrap));
        return workers.every((w) => w.capabilities!.memoryFreeBytes! < MEMORY);
      }, 10_000);
      // training needs gradients and AdamW's moments too: the workers refuse with a typed error and keep serving
      await assert.rejects(dm.trainer({ optimizer: { lr: 1e-3 }, totalSteps: 1 }), { name: 'MemoryBudgetError', message: /needs [\d.]+ MiB more; this worker has/ });
      assert.deepEqual((await dm.generate([5, 6, 7], { maxNewTokens: 8, temperature: 0, stopTokens: [] })).tokens, expected);
      await dm.close();
      // and a plan for training says it cannot fit, and by how much
      await assert.rejects(distribute(node, swarm.bootstrap, dir, { training: true }), { name: 'PlanInfeasibleError', message: /MiB short/ });
    } finally {
      await swarm.close();
      rmSync(root, { recursive: true, force: true });
    }
  });
});
