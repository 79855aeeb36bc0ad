// Prompts of any length share a graph on a device (#46): a first prompt is padded at its end to a power of two of
// positions (32, 64, …), so on webgpu (SwiftShader here) prompts of 5 and 11 tokens decode with the graphs the first
// one compiled (the padded prompt's and the bounded cache's), and each gives the greedy tokens of the same model on js.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createModel, deviceStepModel, generate, generateWith, llamaConfig } from '../../src/models/index.ts';
import { jsBackend, loadBackend, withBackend } from '../../src/tensor/index.ts';

test('prompts of 5 and 11 tokens decode on webgpu with one prompt graph and one decoding graph, as js decodes them', async (t) => {
  const config = llamaConfig({ vocabSize: 97, hidden: 32, layers: 2, heads: 4, kvHeads: 2, intermediate: 64, maxPositions: 64 });
  const model = createModel(config, { seed: 3 });
  const steps = (loadBackend('webgpu') as unknown as { steps: { compiled: number } }).steps;
  const counts: number[] = [];
  for (const prompt of [[5, 9, 2, 44, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]) {
    const want = await withBackend(jsBackend, () => generate(model, prompt, { maxNewTokens: 6, temperature: 0, stopTokens: [] }));
    const before = steps.compiled;
    const [tokens] = await generateWith(deviceStepModel(model, 'webgpu'), [prompt], { maxNewTokens: 6, temperature: 0, stopTokens: [] });
    counts.push(steps.compiled - before);
    assert.deepEqual(tokens, want.tokens, `a prompt of ${prompt.length}`);
  }
  t.diagnostic(`graphs compiled: ${counts.join(', then ')}`);
  assert.deepEqual(counts, [2, 0], 'the first prompt compiles the padded prompt\'s graph and the bounded cache\'s; the second none');
});
