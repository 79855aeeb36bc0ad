// Issue #49: onnxruntime keeps a prepacked copy of a compact weight in each session it makes for it (one per pool size
// and per fused group), beside the weight the worker holds. A worker counts those copies in the job's budget
// (`runtime`), admits a load only with one copy of each matrix reserved, and lets them go with the job.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  CheckpointWeights, compactWeight, configToHF, createModel, llamaConfig, partHeldBytes, saveModel, weightBytes,
} from '../../src/models/index.ts';
import { CHUNK_BYTES, createNode } from '../../src/p2p/index.ts';
import { createOrtBackend, getBackend, ortAvailable, randn, setBackend, tensor } from '../../src/tensor/index.ts';
import { checkpointSource, RemoteStage } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { startWorker } from '../../src/worker/index.ts';

const config = llamaConfig({ vocabSize: 128, hidden: 64, layers: 2, heads: 4, kvHeads: 2, intermediate: 160, maxPositions: 32 });
const range: [number, number] = [1, config.layers + 1];

describe('what onnxruntime keeps beside compact weights', { skip: !ortAvailable() && 'onnxruntime cannot load here' }, () => {
  let dir = '';
  const previous = getBackend();
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'tl-backend-copies-'));
    await saveModel(createModel(config, { seed: 3 }), join(dir, 'model'));
    // every product through onnxruntime, however small: each matrix gets its session (and each fused group its own)
    setBackend(createOrtBackend({ threads: 2, minMacs: 0 }));
  });
  after(() => {
    setBackend(previous);
    rmSync(dir, { recursive: true, force: true });
  });

  test('counted in the job\'s budget as the sessions are made, reserved at load, admitted only with room for them, released with the job', async () => {
    const backend = getBackend();
    const ckpt = CheckpointWeights.open(join(dir, 'model'), { chunkBytes: CHUNK_BYTES, cacheDir: null });
    const weights = partHeldBytes(config, range, 'int4');
    // one copy of each int4 matrix: its blocks and scales as the session holds them
    const reserve = ckpt.partWeights(range).reduce((n, w) => n + (compactWeight(w.name, w.shape) ? weightBytes(w.name, w.shape, 'int4') : 0), 0);
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const roomy = await startWorker({ bootstrap: boot, memoryBytes: 64 * 2 ** 20 });
    // room for the weights and for less than one copy of them
    const tight = await startWorker({ bootstrap: boot, memoryBytes: weights + reserve - 1 });
    const user = await createNode();
    try {
      const refused = await RemoteStage.open(user, tight.node.getMultiaddrs()[0], 'tight');
      await assert.rejects(refused.load(configToHF(config), range, checkpointSource(ckpt, range, 'int4'), { format: 'int4' }), {
        name: 'MemoryBudgetError',
      });
      assert.equal(tight.memory.used(), 0, 'nothing is held for a load that was refused');
      await refused.close();

      const stage = await RemoteStage.open(user, roomy.node.getMultiaddrs()[0], 'job');
      await stage.load(configToHF(config), range, checkpointSource(ckpt, range, 'int4'), { format: 'int4' });
      assert.equal(roomy.memory.held('job', 'weights'), weights);
      assert.equal(roomy.memory.held('job', 'runtime'), reserve, 'one copy reserved before anything computes');
      assert.equal(backend.packedSessions!(), 0);

      // a short step: a session per matrix, or per fused group (q, k, v; gate, up, down), each holding one copy of its
      // matrices, all on the one-thread pool
      await stage.forward('s', randn([1, 5, config.hidden], { seed: 1 }), tensor([0, 1, 2, 3, 4], [1, 5], 'int32'), null);
      const sessions = backend.packedSessions!();
      assert.ok(sessions > 0, 'the forward pass made sessions for the int4 matrices');
      assert.equal(roomy.memory.held('job', 'runtime'), reserve, `one copy of each matrix, over ${sessions} sessions`);
      // a long step: the MLP's products pass SINGLE_THREAD_BELOW_MACS, run on the two-thread pool, and its sessions
      // there hold a second copy of gate, up and down
      const long = tensor(Array.from({ length: 64 }, (_, i) => i % 32), [2, 32], 'int32');
      await stage.forward('t', randn([2, 32, config.hidden], { seed: 2 }), long, null);
      const counted = roomy.memory.held('job', 'runtime');
      assert.ok(backend.packedSessions!() > sessions);
      assert.ok(counted > reserve, `${counted} bytes counted against ${reserve} reserved`);
      assert.ok(roomy.memory.used() >= weights + counted, 'the copies are part of what the worker holds against its budget');
      await stage.forward('u', randn([2, 32, config.hidden], { seed: 3 }), long, null);
      assert.equal(roomy.memory.held('job', 'runtime'), counted, 'the same shapes make no new sessions');

      await stage.close();
      await waitUntil(() => roomy.memory.used() === 0);
      assert.equal(roomy.memory.held('job', 'runtime'), 0);
      assert.equal(backend.packedSessions!(), 0, 'the job\'s sessions are released with it');
    } finally {
      ckpt.close();
      await user.stop();
      await Promise.all([roomy.stop(), tight.stop()]);
      await validator.stop();
    }
  });
});

/** Waits for a condition the worker reaches once a stream's close has reached it (no clock is asserted). */
async function waitUntil(done: () => boolean): Promise<void> {
  while (!done()) await new Promise((r) => setTimeout(r, 20));
}
