import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createModel, generate, generateBatch, gpt2Config, KVCache, llamaConfig, sampleToken } from '../../src/models/index.ts';
import { Generator, noGrad, setBackend, tensor } from '../../src/tensor/index.ts';

const configs = {
  gpt2: gpt2Config({ vocabSize: 40, hidden: 32, layers: 2, heads: 4, maxPositions: 48 }),
  llama: llamaConfig({ vocabSize: 40, hidden: 32, layers: 2, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 48 }),
};

describe('generation', () => {
  setBackend('js');
  for (const [arch, config] of Object.entries(configs)) {
    test(`${arch}: decoding with the KV cache equals full recomputation, bit for bit`, () => {
      const model = createModel(config, { seed: 3 });
      const seq = [5, 9, 2, 33, 7, 1, 18, 4];
      const full = noGrad(() => model.forward(tensor(seq, [1, seq.length], 'int32')));
      const cache = new KVCache(config.layers);
      noGrad(() => model.forward(tensor(seq.slice(0, 3), [1, 3], 'int32'), { cache }));
      for (let t = 3; t < seq.length; t++) {
        const step = noGrad(() => model.forward(tensor([seq[t]], [1, 1], 'int32'), { cache }));
        assert.equal(cache.length, t + 1);
        assert.deepEqual(step.data, full.data.subarray(t * 40, (t + 1) * 40), `position ${t}`);
      }
    });

    test(`${arch}: a batch of prompts of different lengths gives each prompt's own continuation`, async () => {
      const model = createModel(config, { seed: 4 });
      const prompts = [[3, 4, 5, 6, 7], [9], [12, 30, 2]];
      const batch = await generateBatch(model, prompts, { maxNewTokens: 6, stopTokens: [] });
      for (let i = 0; i < prompts.length; i++) {
        const alone = await generate(model, prompts[i], { maxNewTokens: 6, stopTokens: [] });
        assert.deepEqual(batch.tokens[i], alone.tokens, `prompt ${i}`);
      }
    });
  }

  test('seeded sampling is reproducible; stop tokens end a sequence; tokens stream', async () => {
    const model = createModel(configs.gpt2, { seed: 5 });
    const opts = { maxNewTokens: 10, temperature: 1.2, topK: 10, topP: 0.9, seed: 7, stopTokens: [] };
    const a = await generate(model, [1, 2], opts);
    const b = await generate(model, [1, 2], opts);
    const c = await generate(model, [1, 2], { ...opts, seed: 8 });
    assert.deepEqual(a.tokens, b.tokens);
    assert.notDeepEqual(a.tokens, c.tokens);
    const streamed: number[] = [];
    const stopAt = a.tokens[3];
    const stopped = await generate(model, [1, 2], { ...opts, stopTokens: [stopAt], onToken: (t) => streamed.push(t) });
    assert.equal(stopped.tokens.at(-1), stopAt);
    assert.ok(stopped.tokens.length <= 4);
    assert.deepEqual(streamed, stopped.tokens);
    // a promise onToken returns holds the next step until it settles (back-pressure)
    const order: string[] = [];
    const held = await generate(model, [1, 2], {
      ...opts,
      maxNewTokens: 3,
      onToken: async (t) => {
        order.push(`token ${t}`);
        await new Promise((r) => setTimeout(r, 5));
        order.push('settled');
      },
    });
    assert.deepEqual(order, held.tokens.flatMap((t) => [`token ${t}`, 'settled']));
  });

  test('top-k and top-p only ever pick from the allowed tokens', () => {
    const logits = Float32Array.from([0, 5, 4.9, 1, 3]);
    const rng = new Generator(1);
    const picks = new Set<number>();
    for (let i = 0; i < 300; i++) picks.add(sampleToken(logits, { temperature: 1, topK: 2 }, rng));
    assert.deepEqual([...picks].sort(), [1, 2]);
    const nucleus = new Set<number>();
    for (let i = 0; i < 300; i++) nucleus.add(sampleToken(logits, { temperature: 1, topP: 0.4 }, rng));
    assert.deepEqual([...nucleus], [1]);
    assert.equal(sampleToken(logits, { temperature: 0 }, rng), 1);
  });

  test('bad options and over-long prompts are refused with typed errors', async () => {
    const model = createModel(configs.gpt2, { seed: 1 });
    await assert.rejects(generate(model, [1], { topP: 0 }), { name: 'InvalidArgumentError' });
    await assert.rejects(generate(model, [], {}), { name: 'InvalidArgumentError' });
    await assert.rejects(generate(model, new Array(40).fill(1), { maxNewTokens: 20 }), { name: 'InvalidArgumentError' });
  });
});
