import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createModel, generate, generateBatch, gpt2Config } from '../../src/models/index.ts';
import { type BatchRunner, type Row, Scheduler, SessionRows, TextStream } from '../../src/serve/index.ts';
import { setBackend } from '../../src/tensor/index.ts';

describe('serving: text as tokens come, batches in order', () => {
  setBackend('js');

  test('a stop string is never shown, not even its first characters; the text before it is', () => {
    const chars = [...'hello wor'].map((c) => c.charCodeAt(0));
    const s = new TextStream((ids) => String.fromCharCode(...ids), ['wor', 'xyz']);
    const shown = chars.map((c) => s.push(c));
    assert.equal(shown.join(''), 'hello ');
    assert.ok(s.stopped);
    assert.equal(s.text(), 'hello ');
    // a prefix held back is shown once the next character rules the stop string out
    const t = new TextStream((ids) => String.fromCharCode(...ids), ['wor']);
    assert.deepEqual([...'awx'].map((c) => t.push(c.charCodeAt(0))), ['a', '', 'wx']);
    assert.equal(t.flush(), '');
    assert.ok(!t.stopped);
  });

  test('each row of a batch decodes as it would alone (its own settings and generator), bit for bit on js', async () => {
    const model = createModel(gpt2Config({ vocabSize: 40, hidden: 16, layers: 2, heads: 2, maxPositions: 48 }), { seed: 2 });
    const prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]];
    const rows = [
      { maxNewTokens: 5, temperature: 0 },
      { maxNewTokens: 9, temperature: 1, seed: 7 },
      { maxNewTokens: 3, temperature: 0.5, topP: 0.9, seed: 3 },
    ];
    const batched = (await generateBatch(model, prompts, { rows })).tokens;
    const alone = await Promise.all(prompts.map(async (p, i) => (await generate(model, p, { ...rows[i], stopTokens: [] })).tokens));
    assert.deepEqual(batched, alone);
    // a cancelled row takes no more steps; the others go on
    let calls = 0;
    const cancelling = rows.map((r, i) => ({ ...r, cancelled: () => i === 1 && ++calls > 2 }));
    const cut = (await generateBatch(model, prompts, { rows: cancelling })).tokens;
    assert.equal(cut[1].length, 2);
    assert.deepEqual([cut[0], cut[2]], [alone[0], alone[2]]);
  });

  test('requests run in the order they came, as many together as fit; beyond the queue a request is refused with RateLimitedError', async () => {
    const batches: number[][][] = [];
    let release: () => void = () => {};
    const run: BatchRunner = async (prompts) => {
      batches.push(prompts);
      if (batches.length === 1) await new Promise<void>((r) => (release = r));
      return { tokens: prompts.map(() => []) };
    };
    const s = new Scheduler(run, 10, { rows: 3, queued: 3, gatherMs: 0 });
    const row = (n: number, max = 1) => ({ prompt: new Array<number>(n).fill(1), options: { maxNewTokens: max }, onToken: () => {} });
    const first = s.submit([row(1)]);
    await new Promise((r) => setImmediate(r)); // the first starts on its own
    const rest = [s.submit([row(2), row(2)]), s.submit([row(3)]), s.submit([row(4, 8)])];
    assert.throws(() => s.submit([row(5)]), (e: Error) => e.name === 'RateLimitedError');
    release();
    await Promise.all([first, ...rest]);
    // [1] alone (the model was free); then 2+2 and 3 (3 rows); then 4 (4 + 8 > 10 with the others' prompts)
    assert.deepEqual(batches.map((b) => b.map((p) => p.length)), [[1], [2, 2, 3], [4]]);
    assert.deepEqual(s.counts, { requests: 4, rows: 5, batches: 3, refused: 1 });
  });

  test('clients served together and coming back a few milliseconds apart share the next batch; a lone client never waits', async () => {
    const batches: number[] = [];
    const run: BatchRunner = async (prompts) => {
      batches.push(prompts.length);
      return { tokens: prompts.map(() => []) };
    };
    const s = new Scheduler(run, 100, { rows: 4, queued: 16, gatherMs: 20 });
    const row = () => ({ prompt: [1], options: { maxNewTokens: 1 }, onToken: () => {} });
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    // a lone client: each request alone, at once
    for (let i = 0; i < 2; i++) {
      const t = performance.now();
      await s.submit([row()]);
      assert.ok(performance.now() - t < 15, 'no gathering wait for a lone client');
    }
    // two clients at once (one batch of 2), then both come back 5 ms apart: one batch again, not 1 + 1
    await Promise.all([s.submit([row()]), s.submit([row()])]);
    await Promise.all([s.submit([row()]), sleep(5).then(() => s.submit([row()]))]);
    assert.deepEqual(batches, [1, 1, 2, 2]);
    // only one comes back: it runs alone once the wait is over
    const t = performance.now();
    await s.submit([row()]);
    assert.ok(performance.now() - t >= 15, 'it waited for the other');
    assert.deepEqual(batches, [1, 1, 2, 2, 1]);
  });

  test('sessions of their own (a hosted model): rows start at once up to the limit, the rest wait; a row that fails ends its request alone', async () => {
    const started: string[] = [];
    const gates = new Map<string, () => void>();
    const decode = (row: Row) => {
      const name = String.fromCharCode(...row.prompt);
      started.push(name);
      if (name === 'bad') return Promise.reject(new Error('a host was lost'));
      return new Promise<void>((resolve) => gates.set(name, resolve));
    };
    const s = new SessionRows(decode, { rows: 3, queued: 1 });
    const row = (name: string): Row => ({ prompt: [...name].map((c) => c.charCodeAt(0)), options: {}, onToken: () => {} });
    const a = s.submit([row('a'), row('b')]);
    const bad = s.submit([row('bad')]);
    const c = s.submit([row('c'), row('d')]);
    assert.throws(() => s.submit([row('e')]), { name: 'RateLimitedError' });
    await assert.rejects(bad, /a host was lost/);
    await new Promise((r) => setImmediate(r));
    // a, b and bad started at once; c and d wait for room (bad's ended)
    assert.deepEqual(started, ['a', 'b', 'bad']);
    gates.get('a')!();
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(started, ['a', 'b', 'bad', 'c', 'd'], 'c and d started as soon as both fit');
    for (const g of ['b', 'c', 'd']) gates.get(g)!();
    await Promise.all([a, c]);
    assert.deepEqual({ requests: s.counts.requests, rows: s.counts.rows, refused: s.counts.refused }, { requests: 3, rows: 5, refused: 1 });
  });
});
