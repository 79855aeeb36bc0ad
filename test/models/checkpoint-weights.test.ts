import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  CheckpointWeights, createModel, gpt2Config, llamaConfig, loadModel, type ModelPart, partBytes, saveModel,
} from '../../src/models/index.ts';
import { setBackend } from '../../src/tensor/index.ts';

const configs = [
  gpt2Config({ vocabSize: 40, hidden: 16, layers: 3, heads: 2, maxPositions: 16 }),
  gpt2Config({ vocabSize: 40, hidden: 16, layers: 3, heads: 2, maxPositions: 16, tieWordEmbeddings: false }),
  llamaConfig({ vocabSize: 40, hidden: 16, layers: 3, heads: 2, kvHeads: 1, intermediate: 24, maxPositions: 16 }),
  llamaConfig({ vocabSize: 40, hidden: 16, layers: 3, heads: 2, kvHeads: 1, intermediate: 24, maxPositions: 16, tieWordEmbeddings: true }),
];

for (const config of configs) {
  test(`${config.arch}${config.tieWordEmbeddings ? ' (tied)' : ''}: a checkpoint's parts have the weights the model's parts have, and load alone`, async () => {
    setBackend('js');
    const dir = mkdtempSync(join(tmpdir(), 'tl-parts-'));
    try {
      const model = createModel(config, { seed: 4 });
      await saveModel(model, dir, { maxShardBytes: 6000 }); // sharded
      const weights = CheckpointWeights.open(dir, { chunkBytes: 64, cacheDir: join(dir, 'cache') });
      const state = model.hfStateDict();
      const parts: ModelPart[] = ['ends', [0, 1], [1, 3], [2, 6], [0, 6], [4, 6], [5, 6]];
      for (const part of parts) {
        const built = createModel(config, { section: part });
        const own = built.hfStateDict();
        assert.equal(partBytes(config, part), 4 * built.numParameters(), `bytes of part ${part}`);
        const listed = weights.partWeights(part);
        assert.deepEqual(listed.map((w) => w.name).sort(), [...own.keys()].sort(), `part ${part}`);
        for (const w of listed) assert.deepEqual(w.shape, [...own.get(w.name)!.shape]);
        const loaded = await loadModel(dir, { part });
        for (const [name, t] of loaded.hfStateDict()) assert.deepEqual(t.data, state.get(name)!.data, name);
      }
      // chunks are the float32 bytes of the weight, in order; their hashes are cached across opens
      const name = weights.names()[0];
      const bytes = new Uint8Array(state.get(name)!.data.buffer.slice(0));
      const joined = new Uint8Array(Array.from({ length: weights.chunkCount(name) }, (_, i) => [...weights.chunk(name, i)]).flat());
      assert.deepEqual(joined, bytes);
      const hashes = await weights.hashes(name);
      weights.close();
      const again = CheckpointWeights.open(dir, { chunkBytes: 64, cacheDir: join(dir, 'cache') });
      assert.equal(again.cached(name), true);
      assert.deepEqual(await again.hashes(name), hashes);
      again.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
}
