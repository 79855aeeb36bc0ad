import assert from 'node:assert/strict';
import { type ChildProcess, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { createNode, parseStatsAnswer, request } from '../../src/p2p/index.ts';
import { generate, loadModel } from '../../src/models/index.ts';
import { noGrad, setBackend, tensor } from '../../src/tensor/index.ts';
import { startServe } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
const PROMPTS = ['The quick brown fox', 'Hello, world', 'Once upon a time', 'In the beginning', 'To be or not', 'A B C', 'zzz', 'Lorem ipsum'];

function cli(...args: string[]): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8', timeout: 120_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** What `tensorlink generate` prints for a greedy continuation. */
function generated(dir: string, prompt: string, tokens: number, where: string[] = []): string {
  const greedy = ['--max-new-tokens', String(tokens), '--temperature', '0', '--json', '--backend', 'js'];
  const r = cli('generate', '--model', dir, '--prompt', prompt, ...greedy, ...where);
  assert.equal(r.code, 0, r.stderr);
  return (JSON.parse(r.stdout) as { text: string }).text;
}

type Chunk = { choices: { text?: string; delta?: { content?: string | null }; finish_reason: string | null }[] };

/** A stream's text and its last finish reason. */
async function streamed(stream: AsyncIterable<Chunk>) {
  let text = '';
  let finish: string | null = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.text ?? c.delta?.content ?? '';
      finish = c.finish_reason ?? finish;
    }
  }
  return { text, finish };
}

describe('the OpenAI-compatible API, with the official openai client', () => {
  let dir: string;
  const running: ChildProcess[] = [];
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'tl-serve-'));
    const r = cli('init-model', '--arch', 'gpt2', '--layers', '2', '--hidden', '32', '--heads', '2', '--out', join(dir, 'tiny'), '--seed', '5');
    assert.equal(r.code, 0, r.stderr);
  });
  after(() => {
    for (const c of running) c.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('a local model: completions and chat, streamed and not, greedy as generate; errors in OpenAI\'s shape; 32 streams at once', async () => {
    const model = join(dir, 'tiny');
    const { child, url } = await startServe(['--model', model]);
    running.push(child);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });

    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), ['tiny']);

    // greedy completion = tensorlink generate, whole and streamed
    const expected = generated(model, PROMPTS[0], 12);
    const whole = await client.completions.create({ model: 'tiny', prompt: PROMPTS[0], max_tokens: 12, temperature: 0 });
    assert.equal(whole.choices[0].text, expected);
    assert.equal(whole.choices[0].finish_reason, 'length');
    assert.equal(whole.usage?.completion_tokens, 12);
    assert.equal(whole.usage?.prompt_tokens, Buffer.byteLength(PROMPTS[0]));
    const s = await streamed(await client.completions.create({ model: 'tiny', prompt: PROMPTS[0], max_tokens: 12, temperature: 0, stream: true }));
    assert.deepEqual(s, { text: expected, finish: 'length' });

    // chat: the default template's prompt, greedy; streamed equals whole; a stop string cuts the text
    const messages = [{ role: 'system' as const, content: 'be brief' }, { role: 'user' as const, content: 'hi there' }];
    const chat = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 10, temperature: 0 });
    const rendered = generated(model, 'system: be brief\nuser: hi there\nassistant:', 10);
    assert.equal(chat.choices[0].message.content, rendered.split('\nuser:')[0]);
    assert.equal(chat.choices[0].message.role, 'assistant');
    const chatStream = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let usage: unknown = null;
    let text = '';
    for await (const chunk of chatStream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, chat.choices[0].message.content);
    assert.deepEqual(usage, chat.usage);
    if (expected.length > 3) {
      const stop = expected.slice(2, 4);
      const cut = await client.completions.create({ model: 'tiny', prompt: PROMPTS[0], max_tokens: 12, temperature: 0, stop });
      assert.equal(cut.choices[0].text, expected.slice(0, expected.indexOf(stop)));
      assert.equal(cut.choices[0].finish_reason, 'stop');
    }

    // sampling: a seed repeats; n choices each draw on their own
    const a = await client.completions.create({ model: 'tiny', prompt: 'seeded', max_tokens: 8, temperature: 1, seed: 42, n: 2 });
    const b = await client.completions.create({ model: 'tiny', prompt: 'seeded', max_tokens: 8, temperature: 1, seed: 42, n: 2 });
    assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
    assert.equal(a.choices.length, 2);

    // errors: OpenAI's classes, status codes and codes
    await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }), (e: InstanceType<typeof OpenAI.APIError>) => {
      assert.equal(e.status, 404);
      assert.equal(e.code, 'model_not_found');
      return true;
    });
    await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', temperature: 5 }), (e: InstanceType<typeof OpenAI.APIError>) => e.status === 400);
    await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [] }), (e: InstanceType<typeof OpenAI.APIError>) => e.status === 400);
    await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x'.repeat(300), max_tokens: 4 }), (e: InstanceType<typeof OpenAI.APIError>) => {
      assert.equal(e.status, 400);
      assert.equal(e.code, 'context_length_exceeded');
      assert.match(e.message, /maximum context length is 256 tokens.*304 tokens \(300 in the messages, 4 in the completion\)/);
      return true;
    });
    const raw = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{not json' });
    assert.equal(raw.status, 400);
    assert.equal(((await raw.json()) as { error: { type: string } }).error.type, 'invalid_request_error');

    // 32 streams at once, batched continuously: each ends, each with the text it gets alone (greedy and sampled); they
    // begin with one system prompt, whose pages they share
    const system = 'You are a terse assistant. Answer: ';
    const requests = PROMPTS.flatMap((p, i) => [0, 1, 2, 3].map((k) => ({
      model: 'tiny', prompt: `${system}${p}`, max_tokens: 16 + k, temperature: k % 2 === 0 ? 0 : 0.9, seed: 10 * i + k,
    })));
    const alone: string[] = [];
    for (const r of requests) alone.push((await client.completions.create(r)).choices[0].text);
    const together = await Promise.all(requests.map(async (r) => streamed(await client.completions.create({ ...r, stream: true }))));
    assert.deepEqual(together.map((t) => t.text), alone);
    assert.ok(together.every((t) => t.finish === 'length'));
    const hits = /^tensorlink_serve_prefix_positions_total\{model="tiny",result="hit"\} (\d+)$/m.exec(await (await fetch(`${url}/metrics`)).text());
    assert.ok(Number(hits?.[1]) >= 63 * 32, `the system prompt's 2 full pages found shared: ${hits?.[0]}`);

    // a client that leaves mid-stream: the server goes on serving the others
    const controller = new AbortController();
    const leaving = await client.completions.create({ model: 'tiny', prompt: PROMPTS[1], max_tokens: 200, temperature: 0, stream: true }, { signal: controller.signal });
    try {
      for await (const chunk of leaving) if (chunk.choices.length > 0) controller.abort();
    } catch {
      // the client's own abort
    }
    const still = await client.completions.create({ model: 'tiny', prompt: PROMPTS[0], max_tokens: 12, temperature: 0 });
    assert.equal(still.choices[0].text, expected);
    // what it served, for Prometheus (no swarm here: serving figures only)
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.match(metrics, /^# TYPE tensorlink_serve_requests_total counter$/m);
    assert.match(metrics, /^tensorlink_serve_requests_total\{code="404",model="tiny"\} 1$/m);
    assert.doesNotMatch(metrics, /tensorlink_peers/);
  });

  test('a model split across a local swarm answers as the same model in one process (a lone request decoded speculatively)', async () => {
    const model = join(dir, 'tiny');
    const { child, url } = await startServe(['--model', model, '--local', '2', '--speculative', 'lookup']);
    running.push(child);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
    const expected = generated(model, PROMPTS[2], 10);
    const whole = await client.completions.create({ model: 'tiny', prompt: PROMPTS[2], max_tokens: 10, temperature: 0 });
    assert.equal(whole.choices[0].text, expected);
    const chat = await streamed(await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, temperature: 0, stream: true }));
    assert.equal(chat.text, generated(model, 'user: hi\nassistant:', 6).split('\nuser:')[0]);
    const chatWhole = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, temperature: 0 });
    assert.equal(chatWhole.choices[0].message.content, chat.text);
    const completionStreamed = await streamed(await client.completions.create({ model: 'tiny', prompt: PROMPTS[2], max_tokens: 10, temperature: 0, stream: true }));
    assert.deepEqual(completionStreamed, { text: expected, finish: 'length' });
    const together = await Promise.all(PROMPTS.slice(0, 4).map(async (p) => streamed(await client.completions.create({ model: 'tiny', prompt: p, max_tokens: 8, temperature: 0, stream: true }))));
    const alone = PROMPTS.slice(0, 4).map((p) => generated(model, p, 8));
    assert.deepEqual(together.map((t) => t.text), alone);

    // the dashboard beside the API: the swarm as its validator sees it (this server's job among its jobs), and /metrics
    const page = await fetch(`${url}/`);
    assert.equal(page.status, 200);
    assert.match(page.headers.get('content-type') ?? '', /text\/html/);
    type Job = { kind: string; model?: string; step: number; tokens: number };
    type State = { overview: { peers: { roles: string[] }[]; jobs: Job[] }; serving: { requests: Record<string, number> } };
    let state: State | null = null;
    for (let i = 0; i < 40; i++) {
      state = (await (await fetch(`${url}/api/state`)).json()) as State;
      if (state.overview.jobs.some((j) => j.step >= 3)) break;
      await new Promise((r) => setTimeout(r, 250));
    }
    assert.equal(state!.overview.peers.filter((p) => p.roles.includes('worker')).length, 2);
    const job = state!.overview.jobs.find((j) => j.kind === 'generate' && j.model === 'tiny');
    assert.ok(job && job.step >= 3 && job.tokens > 0, `the served job on the validator's board: ${JSON.stringify(state!.overview.jobs)}`);
    assert.ok(state!.serving.requests['200'] >= 6);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.match(metrics, /^tensorlink_serve_requests_total\{code="200",model="tiny"\} \d+$/m);
    assert.match(metrics, /^tensorlink_peers\{role="worker"\} 2$/m);
    assert.match(metrics, /^tensorlink_serve_time_to_first_token_seconds_count\{model="tiny"\} [1-9]\d*$/m);
    // lone requests went speculatively: fewer trips through the workers than tokens
    const counter = (name: string) => Number(new RegExp(`^tensorlink_${name}\\{model="tiny"\\} (\\d+)$`, 'm').exec(metrics)?.[1]);
    assert.ok(counter('serve_speculative_passes_total') < counter('serve_speculative_tokens_total'), metrics.split('\n').filter((l) => l.includes('speculative')).join('; '));

    // a client that leaves mid-stream frees its decoding session on the workers
    const workers = ((await (await fetch(`${url}/api/state`)).json()) as { overview: { peers: { peerId: string; roles: string[]; addrs: string[] }[] } })
      .overview.peers.filter((p) => p.roles.includes('worker'));
    const node = await createNode();
    try {
      const sessions = async () => {
        const stats = await Promise.all(workers.map(async (w) => parseStatsAnswer(await request(node, { peerId: w.peerId, addrs: w.addrs }, { type: 'stats' }))));
        return stats.reduce((n, st) => n + st.sessions, 0);
      };
      const controller = new AbortController();
      const leaving = await client.completions.create({ model: 'tiny', prompt: PROMPTS[3], max_tokens: 200, temperature: 0, stream: true }, { signal: controller.signal });
      let open = -1;
      try {
        for await (const chunk of leaving) {
          if (chunk.choices.length === 0) continue;
          open = await sessions();
          controller.abort();
        }
      } catch {
        // the client's own abort
      }
      // (the plan may hold every layer on one worker: the user's measured links make fewer hops the faster plan)
      assert.ok(open >= 1, `a session on the plan's workers while it streams (${open})`);
      const deadline = Date.now() + 10_000;
      while ((await sessions()) > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      assert.equal(await sessions(), 0, 'no session left on the workers');
    } finally {
      await node.stop();
    }
  });

  test('logprobs and top_logprobs (one process\'s log-softmax within 1e-5), prompts as token ids, response_format json_schema in 56 sampled choices', async (t) => {
    const model = join(dir, 'tiny');
    const { child, url } = await startServe(['--model', model]);
    running.push(child);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0 });
    setBackend('js');
    const lm = await loadModel(model);
    const promptIds = lm.tokenizer!.encode(PROMPTS[1]);
    const ids = (await generate(lm, promptIds, { maxNewTokens: 8, temperature: 0, stopTokens: [] })).tokens;
    // one process: the logits of every position at once, log-softmax in float64
    const logits = noGrad(() => lm.forward(tensor([...promptIds, ...ids], [1, promptIds.length + ids.length], 'int32')));
    const vocab = logits.shape[2];
    const reference = ids.map((id, i) => {
      const row = logits.data.subarray((promptIds.length - 1 + i) * vocab, (promptIds.length + i) * vocab) as Float32Array;
      const max = Math.max(...row);
      const lse = max + Math.log(row.reduce((sum, x) => sum + Math.exp(x - max), 0));
      return row[id] - lse;
    });
    const whole = await client.completions.create({ model: 'tiny', prompt: PROMPTS[1], max_tokens: 8, temperature: 0, logprobs: 3 });
    const lp = whole.choices[0].logprobs!;
    assert.deepEqual(lp.tokens, ids.map((id) => lm.tokenizer!.decode([id])));
    let worst = 0;
    lp.token_logprobs!.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - reference[i]))));
    assert.ok(worst <= 1e-5, `largest difference ${worst}`);
    for (const [i, top] of lp.top_logprobs!.entries()) {
      // the legacy shape keys alternatives by their text: tokens that decode alike alone (parts of a character) share one
      assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 3);
      assert.equal(Math.max(...Object.values(top)), lp.token_logprobs![i], 'greedy: the chosen token is the likeliest');
    }
    assert.deepEqual(lp.text_offset, lp.tokens!.map((_, i) => lp.tokens!.slice(0, i).join('').length));
    // streamed: the same entries, spread over the chunks
    const parts: number[] = [];
    const stream = await client.completions.create({
      model: 'tiny', prompt: PROMPTS[1], max_tokens: 8, temperature: 0, logprobs: 3, stream: true,
    });
    for await (const chunk of stream) parts.push(...(chunk.choices[0]?.logprobs?.token_logprobs ?? []));
    assert.deepEqual(parts, lp.token_logprobs);
    // token ids as the prompt: the same completion as its text; several prompts of ids; an id outside the vocabulary refused
    const byIds = await client.completions.create({ model: 'tiny', prompt: promptIds, max_tokens: 8, temperature: 0, logprobs: 3, echo: true });
    assert.equal(byIds.choices[0].text, PROMPTS[1] + whole.choices[0].text);
    assert.deepEqual(byIds.choices[0].logprobs!.token_logprobs, lp.token_logprobs);
    const two = await client.completions.create({ model: 'tiny', prompt: [promptIds, promptIds.slice(0, 3)], max_tokens: 4, temperature: 0 });
    assert.equal(two.choices.length, 2);
    assert.equal(two.usage?.prompt_tokens, promptIds.length + 3);
    const outside = await client.completions.create({ model: 'tiny', prompt: [1, 100_000], max_tokens: 2 }).then(() => null, (err: { status?: number }) => err.status);
    assert.equal(outside, 400, 'a token id outside the vocabulary is refused');
    // chat: whole and streamed agree, each entry with its 2 likeliest alternatives
    const ask = { model: 'tiny', messages: [{ role: 'user' as const, content: 'Hi' }], max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 };
    const chat = (await client.chat.completions.create(ask)).choices[0].logprobs!.content!;
    assert.equal(chat.length, 6);
    for (const e of chat) {
      assert.equal(e.top_logprobs.length, 2);
      assert.equal(e.top_logprobs[0].logprob, e.logprob);
      assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
    }
    const streamedChat: typeof chat = [];
    const chatStream = await client.chat.completions.create({ ...ask, stream: true });
    for await (const chunk of chatStream) streamedChat.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(streamedChat, chat);
    const refusal = (err: { status?: number }) => err.status;
    const refused = await client.chat.completions.create({ ...ask, logprobs: false }).then(() => null, refusal);
    assert.equal(refused, 400, 'top_logprobs without logprobs is refused');
    t.diagnostic(`completion logprobs: largest difference from one process ${worst.toExponential(1)}; chat entries ${chat.length}`);

    // response_format json_schema: 56 sampled choices, each JSON that parses and matches the schema
    const schema = {
      type: 'object',
      properties: {
        name: { type: 'string', maxLength: 8 }, age: { type: 'integer' }, ok: { type: 'boolean' }, tag: { enum: ['red', 'green'] },
        xs: { type: 'array', items: { type: 'number' }, maxItems: 3 },
      },
      required: ['name', 'age', 'ok', 'tag', 'xs'],
    };
    const docs: string[] = [];
    for (let r = 0; r < 7; r++) {
      const answer = await client.chat.completions.create({
        model: 'tiny', messages: [{ role: 'user', content: 'A person, as JSON' }], max_tokens: 200, temperature: 1, n: 8, seed: r,
        response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } },
      });
      for (const c of answer.choices) {
        assert.equal(c.finish_reason, 'stop', c.message.content ?? '');
        docs.push(c.message.content!);
      }
    }
    for (const doc of docs) {
      const v = JSON.parse(doc) as Record<string, unknown>;
      assert.deepEqual(Object.keys(v), ['name', 'age', 'ok', 'tag', 'xs'], doc);
      assert.ok(typeof v.name === 'string' && v.name.length <= 8 && Number.isInteger(v.age) && typeof v.ok === 'boolean', doc);
      assert.ok(['red', 'green'].includes(v.tag as string), doc);
      assert.ok(Array.isArray(v.xs) && v.xs.length <= 3 && v.xs.every((x) => typeof x === 'number'), doc);
    }
    const distinct = new Set(docs).size;
    assert.ok(distinct >= 5, `sampled, not one document: ${distinct} distinct`);
    // json_object: an object; a schema feature the grammar does not follow is a 400 that names it
    const free = await client.chat.completions.create({
      ...ask, logprobs: false, top_logprobs: undefined, max_tokens: 200, temperature: 1, seed: 1, response_format: { type: 'json_object' },
    });
    if (free.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(free.choices[0].message.content!), 'object');
    const pattern = { type: 'json_schema' as const, json_schema: { name: 'x', schema: { type: 'string', pattern: 'a+' } } };
    const unsupported = await client.chat.completions.create({ ...ask, response_format: pattern })
      .then(() => '', (err: { status?: number; message?: string }) => `${err.status} ${err.message}`);
    assert.match(unsupported, /^400 .*'pattern' is not supported/);
    t.diagnostic(`json_schema: ${docs.length} sampled documents (${distinct} distinct), all valid; e.g. ${docs[0]}`);
  });
});
