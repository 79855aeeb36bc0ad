import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, test } from 'node:test';
import { localSwarm } from '../../src/cli/local-swarm.ts';
import { createModel, gpt2Config, loadModel, partBytes, saveModel } from '../../src/models/index.ts';
import { setBackend } from '../../src/tensor/index.ts';

const run = promisify(execFile);

/** A GPT-2 whose blocks (241 MiB) dwarf its ends (0.6 MiB: a 256-token vocabulary) and the bound below. */
const config = gpt2Config({ vocabSize: 256, hidden: 512, layers: 20, heads: 8, maxPositions: 64 });
/**
 * What the user may hold beyond its ends' training state (weights, gradients, two AdamW moments),
 * whatever the model's size: up to LOAD_CONCURRENCY sections' chunks in flight (4 MiB each, read,
 * hashed, encrypted), weights arriving one at a time on save, and the garbage V8 lets pile up
 * before it collects (its external-memory trigger is 64 MiB). Measured: 58–86 MiB on cold loads,
 * with margin for a slower machine whose collections come later.
 */
const BOUND_BYTES = 128 * 1024 ** 2;

interface UserRun {
  tokens: number[];
  losses: number[];
  heldBytes: number;
  baselineRss: number;
  loadedRss: number;
  peakRss: number;
}

async function userProcess(bootstrap: string, dir: string, mode: 'checkpoint' | 'memory', out: string, cache: string): Promise<UserRun> {
  const { stdout } = await run(process.execPath, ['--import', 'tsx', 'test/helpers/ends-user.ts', bootstrap, dir, mode, out, cache], { timeout: 300_000 });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as UserRun;
}

describe('a model larger than the user\'s machine', () => {
  test('the user streams sections from the checkpoint holding only its ends: same tokens, losses and saved weights as the in-memory path', async () => {
    setBackend('js');
    const root = mkdtempSync(join(tmpdir(), 'tl-large-'));
    const dir = join(root, 'model');
    const model = createModel(config, { seed: 21 });
    await saveModel(model, dir);
    const modelBytes = 4 * model.numParameters();
    const endsBytes = partBytes(config, 'ends');
    assert.ok(modelBytes > 8 * endsBytes, `the checkpoint (${modelBytes} bytes) is more than 8× the ends (${endsBytes} bytes)`);
    const swarm = await localSwarm({ workers: 3, backend: 'ort', threads: 1, handleSignals: false });
    try {
      const streamed = await userProcess(swarm.bootstrap, dir, 'checkpoint', join(root, 'streamed'), join(root, 'cache'));
      const inMemory = await userProcess(swarm.bootstrap, dir, 'memory', join(root, 'pulled'), join(root, 'cache'));
      assert.deepEqual(streamed.tokens, inMemory.tokens);
      assert.deepEqual(streamed.losses, inMemory.losses, 'bit for bit on js');
      assert.equal(streamed.heldBytes, endsBytes);
      const growth = streamed.peakRss - streamed.baselineRss;
      const allowed = 4 * endsBytes + BOUND_BYTES;
      const mb = (b: number) => `${(b / 1024 ** 2).toFixed(1)} MiB`;
      process.stderr.write(`user peak above baseline: streamed ${mb(growth)} (after loading ${mb(streamed.loadedRss - streamed.baselineRss)}) (bound ${mb(allowed)}), in memory ${mb(inMemory.peakRss - inMemory.baselineRss)}; model ${mb(modelBytes)}\n`);
      assert.ok(growth < allowed, `the streaming user grew by ${mb(growth)}, more than its ends' training state + ${mb(BOUND_BYTES)} (${mb(allowed)})`);
      assert.ok(inMemory.peakRss - inMemory.baselineRss > modelBytes, 'the in-memory path holds the whole model (the measure sees it)');
      // the trained model, streamed to sharded files weight by weight, equals the one pulled into memory and saved
      assert.ok(readdirSync(join(root, 'streamed')).includes('model.safetensors.index.json'));
      const a = (await loadModel(join(root, 'streamed'))).hfStateDict();
      const b = (await loadModel(join(root, 'pulled'))).hfStateDict();
      assert.deepEqual([...a.keys()].sort(), [...b.keys()].sort());
      for (const [name, t] of a) assert.deepEqual(t.data, b.get(name)!.data, name);
      assert.notDeepEqual(a.get('transformer.h.0.mlp.c_fc.weight')!.data, model.hfStateDict().get('transformer.h.0.mlp.c_fc.weight')!.data, 'it trained');
    } finally {
      await swarm.close();
      rmSync(root, { recursive: true, force: true });
    }
  });
});
