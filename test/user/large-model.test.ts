import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, test } from 'node:test';
import { localSwarm } from '../../src/swarm/index.ts';
import { createModel, gpt2Config, loadModel, partBytes, saveModel } from '../../src/models/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { helperArgs } from '../helpers/processes.ts';

const run = promisify(execFile);

/**
 * A GPT-2 just big enough to tell streaming from loading: its blocks (144 MiB) are more than the
 * user may grow by (the bound below, 130 MiB), and dwarf its ends (0.6 MiB: a 256-token vocabulary).
 */
const config = gpt2Config({ vocabSize: 256, hidden: 512, layers: 12, heads: 8, maxPositions: 64 });
/**
 * What the user may hold beyond its ends' training state (weights, gradients, two AdamW moments),
 * whatever the model's size: up to LOAD_CONCURRENCY sections' chunks in flight (4 MiB each, read,
 * hashed, encrypted), weights arriving one at a time on save, and the garbage V8 lets pile up
 * before it collects (its external-memory trigger is 64 MiB). Measured: 54–86 MiB on cold loads,
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
  const { stdout } = await run(process.execPath, [...helperArgs('test/helpers/ends-user.ts'), bootstrap, dir, mode, out, cache], { timeout: 300_000 });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as UserRun;
}

describe('a model larger than the user\'s machine', () => {
  test('the user streams sections from the checkpoint holding only its ends: same tokens, loss and saved weights as the in-memory path', async () => {
    setBackend('js');
    const root = mkdtempSync(join(tmpdir(), 'tl-large-'));
    const dir = join(root, 'model');
    const model = createModel(config, { seed: 21 });
    await saveModel(model, dir);
    const modelBytes = 4 * model.numParameters();
    const endsBytes = partBytes(config, 'ends');
    const allowed = 4 * endsBytes + BOUND_BYTES;
    assert.ok(modelBytes > 8 * endsBytes, `the checkpoint (${modelBytes} bytes) is more than 8× the ends (${endsBytes} bytes)`);
    assert.ok(modelBytes > allowed, `the checkpoint (${modelBytes} bytes) is more than the user may grow by (${allowed} bytes): a user that held it would break the bound`);
    const swarm = await localSwarm({ workers: 3, backend: 'ort', threads: 1, handleSignals: false });
    try {
      const streamed = await userProcess(swarm.bootstrap, dir, 'checkpoint', join(root, 'streamed'), join(root, 'cache'));
      const inMemory = await userProcess(swarm.bootstrap, dir, 'memory', join(root, 'pulled'), join(root, 'cache'));
      assert.deepEqual(streamed.tokens, inMemory.tokens);
      assert.deepEqual(streamed.losses, inMemory.losses, 'bit for bit on js');
      assert.equal(streamed.heldBytes, endsBytes);
      const growth = streamed.peakRss - streamed.baselineRss;
      const mb = (b: number) => `${(b / 1024 ** 2).toFixed(1)} MiB`;
      process.stderr.write(`user peak above baseline: streamed ${mb(growth)} (after loading ${mb(streamed.loadedRss - streamed.baselineRss)}) (bound ${mb(allowed)}), in memory ${mb(inMemory.peakRss - inMemory.baselineRss)}; model ${mb(modelBytes)}\n`);
      assert.ok(growth < allowed, `the streaming user grew by ${mb(growth)}, more than its ends' training state + ${mb(BOUND_BYTES)} (${mb(allowed)})`);
      assert.ok(inMemory.peakRss - inMemory.baselineRss > modelBytes, 'the in-memory path holds the whole model (the measure sees it)');
      // the trained model, streamed to sharded files weight by weight, loads, and its files are byte for byte those of
      // the in-memory path's (same tensors, names, shards, index and config)
      const files = readdirSync(join(root, 'streamed')).sort();
      assert.ok(files.includes('model.safetensors.index.json'));
      assert.deepEqual(files, readdirSync(join(root, 'pulled')).sort());
      for (const f of files) assert.ok(readFileSync(join(root, 'streamed', f)).equals(readFileSync(join(root, 'pulled', f))), f);
      const trained = (await loadModel(join(root, 'streamed'))).hfStateDict();
      assert.deepEqual([...trained.keys()].sort(), [...model.hfStateDict().keys()].sort());
      assert.notDeepEqual(trained.get('transformer.h.0.mlp.c_fc.weight')!.data, model.hfStateDict().get('transformer.h.0.mlp.c_fc.weight')!.data, 'it trained');
    } finally {
      await swarm.close();
      rmSync(root, { recursive: true, force: true });
    }
  });
});
