// Continuous batching for a model in this process (issue #48): a request joins the running batch at the next step and
// leaves when it ends; each row's tokens are those of its request alone, bit for bit on js.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createModel, generate, llamaConfig } from '../../src/models/index.ts';
import { ContinuousScheduler, type Row } from '../../src/serve/index.ts';
import { setBackend } from '../../src/tensor/index.ts';

describe('continuous batching', () => {
  setBackend('js');
  const config = llamaConfig({ vocabSize: 48, hidden: 32, layers: 2, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 96 });
  const model = createModel(config, { seed: 7 });

  test('a request that comes mid-batch gets its first token at the next step, and every row its own tokens', async () => {
    const scheduler = new ContinuousScheduler(model);
    const got = new Map<string, number[]>();
    const events: string[] = [];
    const row = (name: string, prompt: number[], maxNewTokens: number, temperature: number, onToken?: (n: number) => void): Row => ({
      prompt,
      options: { maxNewTokens, temperature, seed: 11, stopTokens: [] },
      onToken: (token) => {
        const list = got.get(name) ?? [];
        list.push(token);
        got.set(name, list);
        events.push(name);
        onToken?.(list.length);
      },
    });
    let late: Promise<void> | null = null;
    const long = scheduler.submit([row('long', [3, 1, 4, 1, 5], 30, 0.9, (n) => {
      // a request comes while the long one decodes: it joins at the next step, not when the long one ends
      if (n === 5) late = scheduler.submit([row('late', [2, 7, 1, 8], 6, 0), row('late2', [9, 9], 4, 1.2)]);
    })]);
    await long;
    await late;
    // late's first token came right after long's 5th, before its 6th (the next step)
    const firstLate = events.indexOf('late');
    assert.equal(events.slice(0, firstLate).filter((e) => e === 'long').length, 5, events.join(' '));
    // late (6 tokens) ended long before long (30)
    assert.ok(events.lastIndexOf('late') < events.lastIndexOf('long'));
    const alone = async (prompt: number[], maxNewTokens: number, temperature: number) =>
      (await generate(model, prompt, { maxNewTokens, temperature, seed: 11, stopTokens: [] })).tokens;
    assert.deepEqual(got.get('long'), await alone([3, 1, 4, 1, 5], 30, 0.9));
    assert.deepEqual(got.get('late'), await alone([2, 7, 1, 8], 6, 0));
    assert.deepEqual(got.get('late2'), await alone([9, 9], 4, 1.2));
    // one step per token of the longest row: the late rows rode along
    assert.equal(scheduler.counts.batches, 29);
    assert.deepEqual({ requests: scheduler.counts.requests, rows: scheduler.counts.rows }, { requests: 2, rows: 3 });
  });

  test('rows beyond the batch wait for room; a row whose reader left stops; one whose reader fails ends its request alone; too many waiting are refused', async () => {
    const scheduler = new ContinuousScheduler(model, { rows: 2, queued: 2 });
    const done: string[] = [];
    let gone = false;
    const row = (name: string, maxNewTokens: number, cancelled?: () => boolean): Row => ({
      prompt: [1, 2, 3],
      options: { maxNewTokens, temperature: 0, stopTokens: [], ...(cancelled ? { cancelled } : {}) },
      onToken: () => {},
    });
    const a = scheduler.submit([row('a', 50, () => gone)]).then(() => done.push('a'));
    const b = scheduler.submit([row('b1', 3), row('b2', 3)]).then(() => done.push('b'));
    assert.throws(() => scheduler.submit([row('c', 1)]), { name: 'RateLimitedError' });
    gone = true;
    await Promise.all([a, b]);
    assert.deepEqual(done, ['a', 'b'], 'b waited for room beside a, which stopped when its reader left');
    // a row whose reader fails ends its own request; the other goes on
    const broken = scheduler.submit([{ ...row('x', 8), onToken: (t) => {
      if (t >= 0) throw new Error('the reader broke');
    } }]);
    const fine = scheduler.submit([row('y', 8)]);
    await assert.rejects(broken, /the reader broke/);
    await fine;
  });

  test('32 rows with one 1,000-token system prompt hold its pages once: the KV memory is one prompt\'s plus their own', async () => {
    const long = createModel({ ...config, maxPositions: 1024 }, { seed: 7 });
    const scheduler = new ContinuousScheduler(long);
    const system = Array.from({ length: 1000 }, (_, i) => (i * 13 + 5) % 48);
    const prompts = Array.from({ length: 32 }, (_, u) => [...system, u % 48, (u * 7) % 48, 3, 1, (u * 5) % 48]);
    const got = prompts.map(() => [] as number[]);
    let peak = 0;
    await Promise.all(prompts.map((prompt, u) => scheduler.submit([{
      prompt,
      options: { maxNewTokens: 4, temperature: 0, stopTokens: [] },
      onToken: (token) => {
        got[u].push(token);
        peak = Math.max(peak, scheduler.kv().bytes);
      },
    }])));
    // a page: 16 positions of 2 key heads of 8 values, keys and values, float32, in each of 2 layers
    const page = 16 * 2 * 8 * 2 * 4 * 2;
    // the prompt's 62 full pages once; each row's own page: positions 992–1007 (its last 13 of the prompt, 3 tokens fed)
    assert.equal(peak, (62 + 32) * page, `${peak} bytes; without sharing ${32 * 63 * page}`);
    const kv = scheduler.kv();
    const { hits, prefixPages, sharedPages } = kv;
    assert.deepEqual({ hits, prefixPages, sharedPages }, { hits: 31 * 992, prefixPages: 62, sharedPages: 0 });
    assert.equal(kv.bytes, 62 * page, 'the rows let go of their pages; the prefix is kept for the next');
    for (const u of [0, 1, 31]) {
      assert.deepEqual(got[u], (await generate(long, prompts[u], { maxNewTokens: 4, temperature: 0, stopTokens: [] })).tokens, `row ${u}`);
    }
  });
});
