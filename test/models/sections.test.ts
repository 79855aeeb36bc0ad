import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createModel, gpt2Config, KVCache, llamaConfig } from '../../src/models/index.ts';
import { noGrad, setBackend, type Tensor, tensor } from '../../src/tensor/index.ts';

const configs = {
  'gpt2 (tied head)': gpt2Config({ vocabSize: 40, hidden: 32, layers: 4, heads: 4, maxPositions: 32 }),
  'llama (untied, GQA)': llamaConfig({ vocabSize: 40, hidden: 32, layers: 4, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 32 }),
  'llama (tied)': llamaConfig({ vocabSize: 40, hidden: 32, layers: 4, heads: 4, intermediate: 48, maxPositions: 32, tieWordEmbeddings: true }),
};

describe('sections of a model (what a worker holds)', () => {
  setBackend('js');
  for (const [name, config] of Object.entries(configs)) {
    test(`${name}: three sections built apart compute the whole model bit for bit, with and without a cache`, () => {
      const whole = createModel(config, { seed: 3 });
      const state = whole.hfStateDict();
      const cuts = [0, 2, 4, config.layers + 3];
      const sections = cuts.slice(1).map((end, i) => {
        const part = createModel(config, { section: [cuts[i], end] });
        const own = part.hfStateDict();
        for (const key of own.keys()) assert.ok(state.has(key), `${key} is a checkpoint name`);
        part.loadStateDict(new Map([...own.keys()].map((k) => [k, state.get(k)!])));
        return part;
      });
      // each parameter lives in exactly one section, except a tied head's table
      const held = sections.flatMap((s) => [...s.hfStateDict().keys()]);
      assert.ok(held.length >= state.size && new Set(held).size === state.size);
      const ids = tensor([3, 9, 1, 22, 5, 7], [1, 6], 'int32');
      const chain = (input: Tensor, caches?: KVCache[]) => {
        let x = input;
        sections.forEach((s, i) => {
          x = noGrad(() => s.forward(x, caches ? { cache: caches[i] } : {}));
        });
        return x;
      };
      const full = noGrad(() => whole.forward(ids));
      assert.deepEqual(chain(ids).data, full.data);
      const caches = sections.map(() => new KVCache(config.layers));
      chain(ids.narrow(1, 0, 4), caches);
      const step = chain(ids.narrow(1, 4, 1), caches);
      assert.deepEqual(step.data, full.data.subarray(4 * 40, 5 * 40));
      assert.throws(() => sections[1].forward(ids), { name: 'InvalidArgumentError' });
      assert.throws(() => createModel(config, { section: [3, 2] }), { name: 'InvalidArgumentError' });
    });
  }
});
