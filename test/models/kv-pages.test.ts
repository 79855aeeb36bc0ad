import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  createModel, decodeRows, defaultPositions, gpt2Config, GrowingKV, KVCache, KVPagePool, llamaConfig, PagedKV, PrefixCache, prefillShared,
} from '../../src/models/index.ts';
import { createOrtBackend, Generator, noGrad, ortAvailable, randn, setBackend, tensor, type Tensor, withBackend } from '../../src/tensor/index.ts';
import { attendTimeMajor } from '../../src/tensor/ops/attention.ts';

const configs = {
  gpt2: gpt2Config({ vocabSize: 40, hidden: 32, layers: 3, heads: 4, maxPositions: 96 }),
  llama: llamaConfig({ vocabSize: 40, hidden: 32, layers: 3, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 96 }),
};
const SYSTEM = Array.from({ length: 37 }, (_, i) => (i * 7 + 3) % 40);

/** Logits of a prompt's prefill and of `steps` greedy decoding steps after it, through `cache`. */
function decode(model: ReturnType<typeof createModel>, prompt: number[], cache: KVCache, steps: number): Float32Array[] {
  const out: Float32Array[] = [];
  let logits = noGrad(() => model.forward(tensor(prompt, [1, prompt.length], 'int32'), { cache, positions: defaultPositions(1, prompt.length, 0), keyMask: null }));
  const v = model.config.vocabSize;
  for (let s = 0; s <= steps; s++) {
    const last = logits.data.slice((logits.shape[1] - 1) * v) as Float32Array;
    out.push(last);
    if (s === steps) break;
    const next = last.indexOf(Math.max(...last));
    const at = cache.length;
    logits = noGrad(() => model.forward(tensor([next], [1, 1], 'int32'), { cache, positions: tensor([at], [1, 1], 'int32'), keyMask: null }));
  }
  return out;
}

describe('a paged KV cache', () => {
  test('attention over pages equals attention over one buffer: bit for bit on js, within 1e-5 on ort', () => {
    const rng = new Generator(3);
    const pool = new KVPagePool(4);
    for (const [tq, tk] of [[1, 1], [1, 9], [3, 11], [16, 16]]) {
      const q = randn([1, 6, tq, 8], { generator: rng });
      const k = randn([1, 2, tk, 8], { generator: rng });
      const v = randn([1, 2, tk, 8], { generator: rng });
      const paged = PagedKV.empty(pool, 2, 8).append(k.narrow(2, 0, tk - tq).contiguous(), v.narrow(2, 0, tk - tq).contiguous());
      paged.append(k.narrow(2, tk - tq, tq).contiguous(), v.narrow(2, tk - tq, tq).contiguous());
      const whole = GrowingKV.append(null, k, v);
      assert.deepEqual(paged.k.data, k.data);
      const exact = withBackend('js', () => attendTimeMajor(q, whole.timeMajor));
      assert.deepEqual(withBackend('js', () => attendTimeMajor(q, paged.timeMajor)).data, exact.data, `${tq} over ${tk}`);
      if (ortAvailable()) {
        const ort = withBackend(createOrtBackend({ threads: 1, minMacs: 0 }), () => attendTimeMajor(q, paged.timeMajor));
        ort.data.forEach((x, i) => assert.ok(Math.abs(x - exact.data[i]) < 1e-5));
      }
      paged.release();
    }
    assert.equal(pool.bytes, 0, 'every page freed with its cache');
  });

  for (const family of ['gpt2', 'llama'] as const) {
    test(`${family}: decoding through a paged cache gives the logits of a growing one bit for bit (js), and a truncated one continues as a fresh one`, () => {
      setBackend('js');
      const model = createModel(configs[family], { seed: 5 });
      const pool = new KVPagePool(8);
      const paged = new KVCache(model.config.layers, pool);
      const want = decode(model, SYSTEM, new KVCache(model.config.layers), 12);
      assert.deepEqual(decode(model, SYSTEM, paged, 12), want);
      assert.equal(pool.pages, Math.ceil((SYSTEM.length + 12) / 8) * model.config.layers);
      // cut back to the middle of a page, and the continuation is that of a cache that only ever held those positions
      paged.truncate(20);
      const fresh = new KVCache(model.config.layers);
      decode(model, SYSTEM.slice(0, 20), fresh, 0);
      const go = (cache: KVCache) => noGrad(() => model.forward(tensor([4, 9], [1, 2], 'int32'), { cache, positions: tensor([20, 21], [1, 2], 'int32'), keyMask: null }));
      assert.deepEqual(go(paged).data, go(fresh).data);
      paged.release();
      assert.equal(pool.bytes, 0);
    });
  }

  test('decodeRows over paged rows equals each row alone', () => {
    setBackend('js');
    const model = createModel(configs.llama, { seed: 8 });
    const pool = new KVPagePool(4);
    const prompts = [SYSTEM.slice(0, 9), SYSTEM.slice(3, 17), SYSTEM.slice(0, 4)];
    const caches = prompts.map(() => new KVCache(model.config.layers, pool));
    const alone = prompts.map((p) => decode(model, p, new KVCache(model.config.layers), 1)[1]);
    const firsts = prompts.map((p, i) => decode(model, p, caches[i], 0)[0]);
    const rows = firsts.map((l, i) => ({
      x: tensor([l.indexOf(Math.max(...l))], [1, 1], 'int32'), cache: caches[i], positions: tensor([prompts[i].length], [1, 1], 'int32'),
    }));
    const outs = noGrad(() => decodeRows(model, rows));
    outs.forEach((o, i) => assert.deepEqual(o.data, alone[i], `row ${i}`));
  });
});

describe('shared prefixes', () => {
  test('sessions that begin with one system prompt share its pages (copy on write) and each gets its own logits', () => {
    setBackend('js');
    const model = createModel(configs.llama, { seed: 2 });
    const pool = new KVPagePool(8);
    const prefix = new PrefixCache(pool);
    const layers = model.config.layers;
    const pageBytes = pool.bytesFor(8, 2 * 8) * layers;
    const prompts = [0, 1, 2, 3].map((u) => [...SYSTEM.slice(0, 35), 11 + u, 20 + u, 30 + u]);
    const caches: KVCache[] = [];
    prompts.forEach((prompt, u) => {
      const cache = new KVCache(layers, pool);
      const rest = prefillShared(prefix, cache, tensor(prompt, [1, prompt.length], 'int32'), (x, positions) =>
        noGrad(() => model.forward(x, { cache, positions, keyMask: null })));
      const v = model.config.vocabSize;
      const alone = decode(model, prompt, new KVCache(layers), 0)[0];
      assert.deepEqual(rest.data.slice((rest.shape[1] - 1) * v), alone, `user ${u}: the first token's logits`);
      // the system prompt's 4 full pages were computed once; each later session computed only positions 32–37
      assert.equal(rest.shape[1], u === 0 ? 38 : 6);
      caches.push(cache);
    });
    // 4 shared pages of every layer, and each session's own last page
    assert.equal(pool.bytes, (4 + prompts.length) * pageBytes);
    assert.deepEqual(prefix.size, { pages: 4, shared: 4 });
    assert.deepEqual(prefix.counts, { hits: 3 * 32, misses: 32 });
    // a cut into a shared page copies that page before the next write: the other sessions' keys stay as they were
    const before = caches[1].layers[0]!.k.data.slice();
    caches[0].truncate(21);
    noGrad(() => model.forward(tensor([1, 2], [1, 2], 'int32'), { cache: caches[0], positions: tensor([21, 22], [1, 2], 'int32'), keyMask: null }));
    assert.deepEqual(caches[1].layers[0]!.k.data, before);
    assert.equal(pool.bytes, (4 + prompts.length) * pageBytes, 'session 0 copied page 2 and let go of its own last page');
    for (const c of caches) c.release();
    assert.equal(pool.bytes, 4 * pageBytes, 'the prefix pages stay for the next session');
    assert.equal(prefix.evictIdle(), 4 * pageBytes);
    assert.equal(pool.bytes, 0);
  });

  test('a section keyed by hidden states returns every position\'s output, the shared ones as kept', () => {
    setBackend('js');
    const section = createModel(configs.llama, { seed: 4, section: [1, 3] });
    const pool = new KVPagePool(4);
    const prefix = new PrefixCache(pool);
    const hidden = randn([1, 14, 32], { generator: new Generator(9) });
    const run = (cache: KVCache) => (x: Tensor, positions: Tensor) => noGrad(() => section.forward(x, { cache, positions, keyMask: null }));
    const want = noGrad(() => section.forward(hidden, { cache: new KVCache(3), positions: defaultPositions(1, 14, 0), keyMask: null }));
    for (let u = 0; u < 2; u++) {
      const cache = new KVCache(3, pool);
      assert.deepEqual(prefillShared(prefix, cache, hidden, run(cache)).data, want.data, `session ${u}`);
    }
    assert.deepEqual(prefix.counts, { hits: 12, misses: 12 });
  });
});
