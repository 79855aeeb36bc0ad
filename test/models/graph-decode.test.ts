// graph-decode.ts: a sequence decoded a token at a time through the whole step as one onnxruntime graph (a bounded
// cache in place) gives the logits of the model op by op on ort with its KV cache: f32 within ORT_TOLERANCE, int4
// (MatMulNBits in both) within the ort tolerance of int4 (relative L2 of each position's logits).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { GraphDecoder } from '../../src/models/generation/graph-decode.ts';
import { createModel, KVCache, llamaConfig } from '../../src/models/index.ts';
import { createOrtBackend, noGrad, ortAvailable, packWeight, tensor, withBackend } from '../../src/tensor/index.ts';
import { drift, ORT_TOLERANCES } from '../../src/verify/index.ts';

describe('decoding with the whole step as one onnxruntime graph', { skip: !ortAvailable() }, () => {
  for (const format of ['f32', 'int4'] as const) {
    test(`a Llama's logits at each position equal op by op (${format})`, () => {
      const config = llamaConfig({ vocabSize: 64, hidden: 128, layers: 2, heads: 4, kvHeads: 2, intermediate: 192, maxPositions: 64 });
      const model = createModel(config, { seed: 5 });
      for (const p of model.parameters()) p.requiresGrad = false;
      if (format === 'int4') for (const [name, t] of model.hfStateDict()) if (t.ndim === 2 && !name.includes('norm')) packWeight(t, format);
      const ids = [3, 17, 42, 5, 9, 60, 1, 33];
      withBackend(createOrtBackend({ threads: 1, minMacs: 0 }), () => {
        const decoder = new GraphDecoder(model, { capacity: 12 });
        for (const round of [0, 1]) {
          decoder.reset();
          const cache = new KVCache(config.layers);
          ids.forEach((id, i) => {
            const graph = decoder.step(id).slice();
            const opByOp = noGrad(() => model.forward(tensor([id], [1, 1], 'int32'), { cache })).data as Float32Array;
            const d = drift(opByOp, graph);
            assert.ok(d <= ORT_TOLERANCES[format], `${format} round ${round} position ${i}: ${d}`);
          });
          assert.equal(decoder.cached, ids.length);
        }
        assert.equal(decoder.profile.steps, 2 * ids.length);
        assert.throws(() => {
          for (let i = decoder.cached; i <= decoder.capacity; i++) decoder.step(1);
        }, /the cache holds 12 tokens/);
      });
    });
  }
});
