import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { repeatKv } from '../../src/models/forward.ts';
import { createModel, GrowingKV, KVCache, llamaConfig } from '../../src/models/index.ts';
import {
  createOrtBackend, Generator, noGrad, ortAvailable, packWeight, randn, scaledDotProductAttention, setBackend, tensor, withBackend,
} from '../../src/tensor/index.ts';
import { attendTimeMajor } from '../../src/tensor/ops/attention.ts';

/** The old decode path: concatenated keys, each key head repeated for its query heads, then attention. */
function reference(q: ReturnType<typeof randn>, k: ReturnType<typeof randn>, v: ReturnType<typeof randn>, groups: number) {
  return scaledDotProductAttention(q, repeatKv(k, groups), repeatKv(v, groups), { causal: true });
}

describe('KV cache that grows in place', () => {
  const rng = new Generator(11);
  const shapes = [
    { b: 1, h: 12, kv: 4, tq: 1, tk: 9, d: 16 },
    { b: 2, h: 4, kv: 2, tq: 3, tk: 7, d: 8 },
    { b: 1, h: 3, kv: 3, tq: 5, tk: 5, d: 6 },
    { b: 1, h: 12, kv: 4, tq: 1, tk: 90, d: 64 },
  ];

  test('attendTimeMajor equals the concatenate-and-repeat path bit for bit on js', () => {
    setBackend('js');
    for (const { b, h, kv, tq, tk, d } of shapes) {
      const q = randn([b, h, tq, d], { generator: rng });
      const k = randn([b, kv, tk, d], { generator: rng });
      const v = randn([b, kv, tk, d], { generator: rng });
      // filled in two appends, the second the queries' own positions
      const split = tk - tq;
      let entry: GrowingKV | null = null;
      if (split > 0) entry = GrowingKV.append(null, k.narrow(2, 0, split), v.narrow(2, 0, split));
      entry = GrowingKV.append(entry, k.narrow(2, split, tq), v.narrow(2, split, tq));
      assert.equal(entry.length, tk);
      assert.deepEqual(entry.k.data, k.data);
      assert.deepEqual(entry.v.data, v.data);
      const y = noGrad(() => attendTimeMajor(q, entry.timeMajor));
      assert.deepEqual(y.data, reference(q, k, v, h / kv).data, `[${b}, ${h}/${kv}, ${tq}, ${tk}, ${d}]`);
    }
  });

  test('on ort it agrees with the js kernel within float tolerance', { skip: !ortAvailable() }, () => {
    for (const { b, h, kv, tq, tk, d } of shapes) {
      const q = randn([b, h, tq, d], { generator: rng });
      const k = randn([b, kv, tk, d], { generator: rng });
      const v = randn([b, kv, tk, d], { generator: rng });
      const entry = GrowingKV.append(null, k, v);
      const exact = withBackend('js', () => attendTimeMajor(q, entry.timeMajor));
      const ort = withBackend(createOrtBackend({ threads: 1, minMacs: 0 }), () => attendTimeMajor(q, entry.timeMajor));
      for (let i = 0; i < exact.size; i++) assert.ok(Math.abs(exact.data[i] - ort.data[i]) < 1e-5, `${i}: ${exact.data[i]} vs ${ort.data[i]}`);
    }
  });

  test('appends write in place while they can, and an entry two caches share stays each one\'s own', () => {
    const k = (t: number, at: number) => tensor(Float32Array.from({ length: 2 * t * 3 }, (_, i) => at * 100 + i), [1, 2, t, 3]);
    const a = GrowingKV.append(null, k(4, 0), k(4, 0));
    const b = GrowingKV.append(a, k(1, 1), k(1, 1));
    const c = GrowingKV.append(a, k(1, 2), k(1, 2)); // a's next position is b's: c takes its own buffers
    assert.equal(b.timeMajor.k, a.timeMajor.k, 'b grew a\'s buffers in place');
    assert.notEqual(c.timeMajor.k, a.timeMajor.k);
    assert.deepEqual(a.k.shape, [1, 2, 4, 3]);
    assert.deepEqual(b.k.data.subarray(12, 15), k(1, 1).data.subarray(0, 3));
    assert.deepEqual(c.k.data.subarray(12, 15), k(1, 2).data.subarray(0, 3));
    // growing past the capacity keeps every position
    let e = b;
    for (let i = 0; i < 70; i++) e = GrowingKV.append(e, k(1, i), k(1, i));
    assert.equal(e.length, 75);
    assert.deepEqual(e.k.data.subarray(0, 12), a.k.data.subarray(0, 12));
    assert.throws(() => GrowingKV.append(e, tensor(new Float32Array(6), [1, 1, 2, 3]), tensor(new Float32Array(6), [1, 1, 2, 3])), { name: 'InvalidArgumentError' });
  });

  test('a cache whose entries are plain keys and values (as a copied cache holds) goes on from them', () => {
    setBackend('js');
    const config = llamaConfig({ vocabSize: 40, hidden: 32, layers: 2, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 48 });
    const model = createModel(config, { seed: 3 });
    const seq = [5, 9, 2, 33, 7, 1];
    const full = noGrad(() => model.forward(tensor(seq, [1, seq.length], 'int32')));
    const first = new KVCache(config.layers);
    noGrad(() => model.forward(tensor(seq.slice(0, 4), [1, 4], 'int32'), { cache: first }));
    const plain = new KVCache(config.layers);
    first.layers.forEach((entry, i) => (plain.layers[i] = entry && { k: entry.k, v: entry.v }));
    assert.equal(plain.length, 4);
    for (let t = 4; t < seq.length; t++) {
      const step = noGrad(() => model.forward(tensor([seq[t]], [1, 1], 'int32'), { cache: plain }));
      assert.deepEqual(step.data, full.data.subarray(t * 40, (t + 1) * 40), `position ${t}`);
    }
  });

  test('the one-token step of a Llama block (decode-step.ts) is the generic block\'s arithmetic on ort (f32, int4), bit for bit', { skip: !ortAvailable() }, () => {
    const config = llamaConfig({ vocabSize: 64, hidden: 128, layers: 2, heads: 4, kvHeads: 2, intermediate: 192, maxPositions: 64 });
    for (const format of [null, 'int4'] as const) {
      const model = createModel(config, { seed: 9 });
      for (const p of model.parameters()) p.requiresGrad = false;
      if (format) for (const [name, t] of model.hfStateDict()) if (t.ndim === 2 && !name.includes('norm')) packWeight(t, format);
      const ids = [3, 17, 42, 5, 9, 60, 1];
      withBackend(createOrtBackend({ threads: 1, minMacs: 0 }), () => {
        // the step runs without gradients; with them on (and none wanted) the generic block runs the same kernels
        const run = (step: boolean) => {
          const cache = new KVCache(config.layers);
          const go = () => model.forward(tensor(ids.slice(0, 3), [1, 3], 'int32'), { cache });
          if (step) noGrad(go);
          else go();
          const out: Float32Array[] = [];
          for (const id of ids.slice(3)) {
            const f = () => model.forward(tensor([id], [1, 1], 'int32'), { cache }).data as Float32Array;
            out.push(step ? noGrad(f) : f());
          }
          return out;
        };
        const fast = run(true);
        const generic = run(false);
        fast.forEach((row, i) => assert.deepEqual(row, generic[i], `${format ?? 'f32'} step ${i}`));
        // and both are the whole sequence's logits within float tolerance
        const full = noGrad(() => model.forward(tensor(ids, [1, ids.length], 'int32'))).data;
        fast.forEach((row, i) => {
          const at = (3 + i) * config.vocabSize;
          for (let j = 0; j < row.length; j++) assert.ok(Math.abs(row[j] - full[at + j]) < 2e-2, `${format ?? 'f32'} step ${i} logit ${j}`);
        });
      });
    }
  });
});
