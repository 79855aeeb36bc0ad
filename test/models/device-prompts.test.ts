// Prompts of any length share a graph on a device (#46): a first prompt is padded at its end to a power of two of
// positions (32, 64, …), so on webgpu (SwiftShader here) prompts of 5 and 11 tokens decode with the graphs the first
// one compiled (the padded prompt's and the bounded cache's), and each gives the greedy tokens of the same model on js.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createModel, DeviceRunner, deviceStepModel, generate, generateWith, llamaConfig } from '../../src/models/index.ts';
import { jsBackend, loadBackend, noGrad, tensor, withBackend } from '../../src/tensor/index.ts';
import { drift, ORT_TOLERANCE } from '../../src/verify/index.ts';

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

test('a model of more positions than a traced rotary table holds (20,000) decodes on webgpu as js does, on the bounded cache', async () => {
  const config = llamaConfig({ vocabSize: 97, hidden: 32, layers: 1, heads: 4, kvHeads: 2, intermediate: 64, maxPositions: 20000 });
  const model = createModel(config, { seed: 4 });
  const prompt = [7, 3, 9];
  const want = await withBackend(jsBackend, () => generate(model, prompt, { maxNewTokens: 8, temperature: 0, stopTokens: [] }));
  const steps = (loadBackend('webgpu') as unknown as { steps: { compiled: number } }).steps;
  const before = steps.compiled;
  const [tokens] = await generateWith(deviceStepModel(model, 'webgpu'), [prompt], { maxNewTokens: 8, temperature: 0, stopTokens: [] });
  assert.deepEqual(tokens, want.tokens);
  assert.equal(steps.compiled - before, 2, 'the padded prompt\'s graph and one decoding graph: the rotary rows are picked by the positions');
});

test('a model whose rotary tables depend on the sequence (dynamic scaling) decodes on webgpu as js computes it, a graph per position', async () => {
  const config = { ...llamaConfig({ vocabSize: 97, hidden: 32, layers: 1, heads: 4, kvHeads: 2, intermediate: 64, maxPositions: 64 }),
    ropeScaling: { type: 'dynamic' as const, factor: 2 } };
  const model = createModel(config, { seed: 5 });
  const ids = [7, 3, 9, 12, 40, 2, 66, 5, 31, 8];
  // js: the whole sequence at once; the device: a prompt of 3, then one token at a time on its cache
  const want = withBackend(jsBackend, () => noGrad(() => model.forward(tensor(Int32Array.from(ids), [1, ids.length], 'int32'))));
  const runner = new DeviceRunner(model, 'webgpu');
  const got = [await runner.step(tensor(Int32Array.from(ids.slice(0, 3)), [1, 3], 'int32'))];
  for (const id of ids.slice(3)) got.push(await runner.step(tensor(Int32Array.of(id), [1, 1], 'int32')));
  const v = config.vocabSize;
  const rows = got.flatMap((t) => Array.from({ length: t.shape[1] }, (_, i) => (t.data as Float32Array).subarray(i * v, (i + 1) * v)));
  rows.forEach((row, i) => {
    const d = drift((want.data as Float32Array).subarray(i * v, (i + 1) * v), row);
    // a bounded step would read no positions here (the tables are constants of its trace): it is not taken
    assert.ok(d <= ORT_TOLERANCE, `position ${i}: ${d}`);
  });
  runner.reset();
});
