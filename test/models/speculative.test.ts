import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  createModel, generate, generateSpeculative, gpt2Config, KVCache, llamaConfig, localStepModel, lookupDraft, modelDrafter,
} from '../../src/models/index.ts';
import { noGrad, setBackend, tensor } from '../../src/tensor/index.ts';

const configs = {
  gpt2: gpt2Config({ vocabSize: 40, hidden: 32, layers: 2, heads: 4, maxPositions: 96 }),
  llama: llamaConfig({ vocabSize: 40, hidden: 32, layers: 2, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 96 }),
};
/** A prompt that repeats itself, as code and quotes do: its n-grams come back. */
const REPEATING = [5, 9, 2, 33, 7, 1, 18, 4, 5, 9, 2, 33, 7, 1, 18, 4, 5, 9];

/** P(X ≥ x) for X chi-squared with `df` degrees of freedom (the regularised upper incomplete gamma, Numerical Recipes). */
function chiSquaredSurvival(x: number, df: number): number {
  const a = df / 2;
  const z = x / 2;
  if (z <= 0) return 1;
  const lnGamma = (v: number) => {
    const c = [76.1800917294715, -86.5053203294168, 24.0140982408309, -1.23173957245016, 0.00120865097386618, -5.395239384953e-6];
    let y = v;
    const tmp = v + 5.5 - (v + 0.5) * Math.log(v + 5.5);
    let ser = 1.00000000019;
    for (const ci of c) ser += ci / ++y;
    return -tmp + Math.log((2.506628274631 * ser) / v);
  };
  if (z < a + 1) {
    let sum = 1 / a;
    let term = sum;
    for (let n = 1; n < 500; n++) {
      term *= z / (a + n);
      sum += term;
    }
    return 1 - sum * Math.exp(-z + a * Math.log(z) - lnGamma(a));
  }
  let b = z + 1 - a;
  let c = 1e300;
  let d = 1 / b;
  let h = d;
  for (let i = 1; i < 500; i++) {
    const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    d = 1 / d;
    c = b + an / c;
    h *= d * c;
  }
  return Math.exp(-z + a * Math.log(z) - lnGamma(a)) * h;
}

describe('speculative decoding', () => {
  setBackend('js');

  test('prompt lookup drafts what followed an earlier occurrence of the longest suffix', () => {
    assert.deepEqual(lookupDraft([1, 2, 3, 9, 1, 2], 3, 4), [3, 9, 1, 2]);
    assert.deepEqual(lookupDraft([1, 2, 3, 9, 1, 2], 3, 2), [3, 9]);
    assert.deepEqual(lookupDraft([4, 1, 5, 1, 6, 1], 2, 3), [5, 1, 6]); // the latest match followed by 3 tokens
    assert.deepEqual(lookupDraft([7, 7, 7, 7], 3, 4), [7]); // a loop: all that follows its one earlier match
    assert.deepEqual(lookupDraft([1, 2, 3], 3, 4), []);
    assert.equal(chiSquaredSurvival(3.84, 1).toFixed(3), '0.050');
    assert.equal(chiSquaredSurvival(18.31, 10).toFixed(3), '0.050');
  });

  test('a truncated cache continues as if the dropped positions had never been computed, bit for bit', () => {
    const model = createModel(configs.llama, { seed: 3 });
    const cache = new KVCache(configs.llama.layers);
    noGrad(() => model.forward(tensor([5, 9, 2, 33, 7], [1, 5], 'int32'), { cache }));
    cache.truncate(3);
    assert.equal(cache.length, 3);
    const after = noGrad(() => model.forward(tensor([8], [1, 1], 'int32'), { cache, positions: tensor([3], [1, 1], 'int32') }));
    const fresh = noGrad(() => model.forward(tensor([5, 9, 2, 8], [1, 4], 'int32')));
    assert.deepEqual(after.data, fresh.data.subarray(3 * 40, 4 * 40));
  });

  for (const [arch, config] of Object.entries(configs)) {
    test(`${arch}: greedy tokens equal decoding without speculation, in fewer passes on a prompt that repeats`, async (t) => {
      const model = createModel(config, { seed: 12 });
      let rejected = 0;
      for (const prompt of [REPEATING, [3, 1, 4, 1, 5, 9, 2, 6]]) {
        const options = { maxNewTokens: 40, temperature: 0, stopTokens: [] };
        const plain = await generate(model, prompt, options);
        const streamed: number[] = [];
        const spec = await generateSpeculative(localStepModel(model), prompt, { ...options, draft: 'lookup', onToken: (t) => streamed.push(t) });
        assert.deepEqual(spec.tokens, plain.tokens, `prompt ${prompt.join(',')}`);
        assert.deepEqual(streamed, spec.tokens);
        assert.ok(spec.accepted <= spec.drafted);
        rejected += spec.drafted - spec.accepted;
        t.diagnostic(`${spec.tokens.length} tokens in ${spec.passes} passes; ${spec.accepted} of ${spec.drafted} drafts accepted`);
        if (prompt === REPEATING) assert.ok(spec.passes < spec.tokens.length, `${spec.passes} passes for ${spec.tokens.length} tokens`);
      }
      assert.ok(rejected > 0, 'some drafts were rejected (the cache was truncated)');
    });
  }

  test('a draft model: greedy tokens equal decoding without speculation; a draft equal to the model has every draft accepted', async (t) => {
    const config = configs.llama;
    const model = createModel(config, { seed: 12 });
    const options = { maxNewTokens: 40, temperature: 0, stopTokens: [] };
    const prompt = [3, 1, 4, 1, 5, 9, 2, 6];
    const plain = await generate(model, prompt, options);
    const same = await generateSpeculative(localStepModel(model), prompt, { ...options, draft: modelDrafter(model, config.vocabSize) });
    assert.deepEqual(same.tokens, plain.tokens);
    assert.equal(same.accepted, same.drafted);
    assert.ok(same.passes <= 10, `${same.passes} passes`);
    const weak = createModel(config, { seed: 13 });
    const other = await generateSpeculative(localStepModel(model), prompt, { ...options, draft: modelDrafter(weak, config.vocabSize) });
    assert.deepEqual(other.tokens, plain.tokens);
    assert.ok(other.accepted < other.drafted, 'another model\'s drafts are sometimes wrong');
    assert.throws(() => modelDrafter(createModel(configs.gpt2, { seed: 1 }), 41), /vocabulary of 40, the model 41/);
    t.diagnostic(`the model as its own draft: ${same.tokens.length} tokens in ${same.passes} passes; another seed's: ${other.passes} passes, `
      + `${other.accepted} of ${other.drafted} accepted`);
  });

  test('sampling: over 2,000 seeds the first 3 tokens follow the distribution of decoding without speculation (chi-squared)', async (t) => {
    const config = llamaConfig({ vocabSize: 6, hidden: 16, layers: 1, heads: 2, kvHeads: 1, intermediate: 24, maxPositions: 32 });
    const model = createModel(config, { seed: 4 });
    const prompt = [1, 2, 3, 1, 2, 3, 1, 2];
    const options = { maxNewTokens: 3, temperature: 0.8, stopTokens: [] };
    const plain = new Map<string, number>();
    const spec = new Map<string, number>();
    let drafted = 0;
    for (let seed = 0; seed < 2000; seed++) {
      const a = (await generate(model, prompt, { ...options, seed })).tokens.join();
      plain.set(a, (plain.get(a) ?? 0) + 1);
      const s = await generateSpeculative(localStepModel(model), prompt, { ...options, seed: 100_000 + seed, draft: 'lookup' });
      drafted += s.drafted;
      const b = s.tokens.join();
      spec.set(b, (spec.get(b) ?? 0) + 1);
    }
    assert.ok(drafted > 1000, `${drafted} tokens drafted`);
    // a 2 × C table of the two samples; categories seen fewer than 10 times in both together are pooled
    const cells: [number, number][] = [];
    const other: [number, number] = [0, 0];
    for (const key of new Set([...plain.keys(), ...spec.keys()])) {
      const pair: [number, number] = [plain.get(key) ?? 0, spec.get(key) ?? 0];
      if (pair[0] + pair[1] >= 10) cells.push(pair);
      else {
        other[0] += pair[0];
        other[1] += pair[1];
      }
    }
    if (other[0] + other[1] > 0) cells.push(other);
    let chi = 0;
    for (const [a, b] of cells) {
      const e = (a + b) / 2; // equal sample sizes
      chi += ((a - e) ** 2 + (b - e) ** 2) / e;
    }
    const p = chiSquaredSurvival(chi, cells.length - 1);
    assert.ok(cells.length > 20, `${cells.length} categories`);
    t.diagnostic(`chi-squared ${chi.toFixed(1)} on ${cells.length - 1} degrees of freedom: p = ${p.toFixed(3)}; ${drafted} tokens drafted`);
    assert.ok(p > 0.01, `chi-squared ${chi.toFixed(1)} on ${cells.length - 1} degrees of freedom: p = ${p.toFixed(4)}`);
  });
});
