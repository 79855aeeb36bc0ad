import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  byteLevelTokenizerJson, type CausalLM, createModel, generate, generateBatch, gpt2Config, HFTokenizer, loadChatTemplate, loadConfig,
  loadModel, loadTokenizer, saveModel, type Tokenizer,
} from '../src/models/index.ts';
import { ChatFormat, MAX_BATCH_ROWS, serveApi, type ServedModel } from '../src/serve/index.ts';
import { type Backend, setBackend } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';

/** Tokens each request asks for (greedy; the random model's greedy continuations here never hit the end-of-sequence token). */
const NEW_TOKENS = 32;
/** Prompts of different lengths (4..44 byte tokens), taken in turn. */
const PROMPTS = [
  'The quick brown fox', 'Hello, world', 'Once upon a time', 'In the beginning was the word, and the word was', 'To be or not', 'A B C',
  'zzz', 'Lorem ipsum dolor sit amet, consectetur adipiscing', 'It was a dark and stormy night', 'Call me Ishmael.', 'def main():',
  'SELECT * FROM users WHERE id =', 'The answer is', 'Roses are red, violets are', 'GET /index.html HTTP/1.1', 'Dear Sir or Madam,',
];
const MODEL_ID = 'bench-gpt2';
const CONCURRENCY = [8, 32];

const log = (s: string) => process.stderr.write(`  serve: ${s}\n`);

/** One request as its client saw it: ms to the first token (or first text chunk), ms to the end, and the tokens it got. */
interface Sample {
  ttft: number;
  total: number;
  tokens: number;
}

/** A run of N requests: its wall time and each request's sample. */
interface Run {
  seconds: number;
  samples: Sample[];
}

const quantile = (v: number[], q: number) => {
  const s = [...v].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
};
const rps = (r: Run) => r.samples.length / r.seconds;
const ttfts = (r: Run) => r.samples.map((s) => s.ttft);
const tokens = (r: Run) => r.samples.reduce((sum, s) => sum + s.tokens, 0);

/** The reference: `generate` in this process, one prompt after another, greedy; time to the first token's onToken callback. */
async function inProcess(model: CausalLM, prompts: number[][]): Promise<Run> {
  const samples: Sample[] = [];
  const start = performance.now();
  for (const prompt of prompts) {
    const t0 = performance.now();
    let first = Number.NaN;
    const { tokens: out } = await generate(model, prompt, {
      maxNewTokens: NEW_TOKENS, temperature: 0, onToken: () => {
        if (Number.isNaN(first)) first = performance.now() - t0;
      },
    });
    samples.push({ ttft: first, total: performance.now() - t0, tokens: out.length });
  }
  return { seconds: (performance.now() - start) / 1000, samples };
}

/** `generateBatch` in this process, `rows` prompts at a time (what the server's scheduler runs at most): its ceiling. */
async function inProcessBatched(model: CausalLM, prompts: number[][], rows: number): Promise<Run> {
  const samples: Sample[] = [];
  const start = performance.now();
  for (let i = 0; i < prompts.length; i += rows) {
    const batch = prompts.slice(i, i + rows);
    const t0 = performance.now();
    const first = batch.map(() => Number.NaN);
    const { tokens: out } = await generateBatch(model, batch, {
      maxNewTokens: NEW_TOKENS, temperature: 0, onToken: (_t, row) => {
        if (Number.isNaN(first[row])) first[row] = performance.now() - t0;
      },
    });
    const total = performance.now() - t0;
    // a row queued behind earlier batches waits for them, as it would in the server
    const waited = t0 - start;
    out.forEach((o, r) => samples.push({ ttft: waited + first[r], total: waited + total, tokens: o.length }));
  }
  return { seconds: (performance.now() - start) / 1000, samples };
}

/** One streamed completion through plain fetch: ms to the first SSE chunk carrying text, ms to the end, completion tokens (usage). */
async function streamCompletion(url: string, prompt: string): Promise<Sample> {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: MODEL_ID, prompt, max_tokens: NEW_TOKENS, temperature: 0, stream: true, stream_options: { include_usage: true },
    }),
  });
  if (!res.ok || !res.body) throw new Error(`POST /v1/completions: ${res.status} ${await res.text()}`);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let ttft = Number.NaN;
  let count = Number.NaN;
  let done = false;
  while (!done) {
    const next = await reader.read();
    if (next.done) break;
    buffer += next.value;
    let at: number;
    while ((at = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      if (!event.startsWith('data: ')) continue;
      const data = event.slice(6);
      if (data === '[DONE]') {
        done = true;
        break;
      }
      type Chunk = { error?: { message: string }; choices?: { text?: string }[]; usage?: { completion_tokens: number } };
      const chunk = JSON.parse(data) as Chunk;
      if (chunk.error) throw new Error(`stream error: ${chunk.error.message}`);
      if (Number.isNaN(ttft) && chunk.choices?.some((c) => (c.text ?? '') !== '')) ttft = performance.now() - t0;
      if (chunk.usage) count = chunk.usage.completion_tokens;
    }
  }
  await reader.cancel().catch(() => {});
  return { ttft, total: performance.now() - t0, tokens: count };
}

/** `texts.length` streamed requests, `inFlight` clients at a time (each sends its next as its last ends). */
async function overHttp(url: string, texts: string[], inFlight: number): Promise<Run> {
  const samples: Sample[] = new Array<Sample>(texts.length);
  let next = 0;
  const client = async () => {
    while (next < texts.length) {
      const i = next++;
      samples[i] = await streamCompletion(url, texts[i]);
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: Math.min(inFlight, texts.length) }, client));
  return { seconds: (performance.now() - start) / 1000, samples };
}

/** The default backend (ort where onnxruntime loads, else js), chosen afresh: an earlier section may have set another. */
function defaultBackend(): Backend {
  try {
    return setBackend('ort');
  } catch {
    return setBackend('js');
  }
}

/** Runs pooled: their requests over their summed time, and all their samples. */
function pool(runs: Run[]): Run {
  return { seconds: runs.reduce((sum, r) => sum + r.seconds, 0), samples: runs.flatMap((r) => r.samples) };
}

/**
 * Requests per second and time to first token of the OpenAI-compatible API (serveApi on
 * loopback, streamed /v1/completions through plain fetch from this process) on a small GPT-2
 * held in this process, against `generate` called in this process on the same model with the
 * same prompts (greedy, NEW_TOKENS new tokens): one request at a time, then 8 and 32 clients
 * in flight, which the server batches (at most MAX_BATCH_ROWS rows per batch). For the
 * concurrent cases, `generateBatch` in batches of MAX_BATCH_ROWS is the in-process ceiling.
 * This machine is shared: the sequential reference and the sequential requests alternate
 * request by request, the other cases come in blocks that alternate round by round, and
 * each figure pools its rounds.
 */
export async function benchServe(quick: boolean): Promise<Row[]> {
  const backend = defaultBackend();
  const backendLabel = backend.name === 'ort' ? `ort, ${(backend as Backend & { threads: number }).threads} threads` : backend.name;
  const rounds = quick ? 3 : 6;
  const perRound = { sequential: quick ? 8 : 16, batched: quick ? 16 : 32, concurrent: (c: number) => (quick ? 2 : 4) * Math.max(c, 16) };
  const dir = mkdtempSync(join(tmpdir(), 'tl-bench-serve-'));
  try {
    // as `tensorlink init-model` makes one, and `tensorlink serve --local 0` serves it
    const config = gpt2Config({ vocabSize: 257, hidden: 128, layers: 4, heads: 4, maxPositions: 256, bosTokenId: 256, eosTokenId: 256 });
    const made = createModel(config, { seed: 0 });
    made.tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
    await saveModel(made, dir);
    const model = await loadModel(dir);
    const tokenizer: Tokenizer = loadTokenizer(dir)!;
    // the rows of each batch the server runs, to show how full its batches are
    const batchRows: number[] = [];
    const served: ServedModel = {
      id: MODEL_ID,
      tokenizer,
      maxPositions: loadConfig(dir).maxPositions,
      chat: new ChatFormat(loadChatTemplate(dir)),
      run: (prompts, options) => {
        batchRows.push(prompts.length);
        return generateBatch(model, prompts, options);
      },
    };
    let offset = 0;
    /** The next k prompts (texts), cycling through PROMPTS. */
    const take = (k: number) => Array.from({ length: k }, () => PROMPTS[offset++ % PROMPTS.length]);
    const encode = (texts: string[]) => texts.map((t) => tokenizer.encode(t));
    const server = await serveApi(served, { host: '127.0.0.1', port: 0 });
    // the same model batched continuously (src/serve/continuous.ts): rows join the running batch at the next step
    const continuousServer = await serveApi({ ...served, local: model }, { host: '127.0.0.1', port: 0 });
    try {
      // warm-up: the model's kernels, Fastify's routes, fetch's connections
      await inProcess(model, encode(take(4)));
      await overHttp(server.url, take(16), 8);
      batchRows.length = 0;

      const ref: Run[] = [];
      const sequential: Run[] = [];
      const batched: Run[] = [];
      const concurrent = new Map<number, { runs: Run[]; batches: number[] }>(CONCURRENCY.map((c) => [c, { runs: [], batches: [] }]));
      const wide = CONCURRENCY[CONCURRENCY.length - 1];
      const continuous: Run[] = [];
      const batchedWide: Run[] = [];
      for (let r = 0; r < rounds; r++) {
        log(`round ${r + 1}/${rounds}: generate and 1 request at a time over HTTP (in turns), generateBatch(${MAX_BATCH_ROWS}), ${CONCURRENCY.join(', ')} clients in flight ...`);
        for (const [i, text] of take(perRound.sequential).entries()) {
          // in turns, each first every other time
          const pair = [() => inProcess(model, encode([text])), () => overHttp(server.url, [text], 1)] as const;
          const [a, b] = i % 2 === 0 ? [0, 1] : [1, 0];
          const first = await pair[a]();
          const second = await pair[b]();
          ref.push(a === 0 ? first : second);
          sequential.push(a === 0 ? second : first);
        }
        batched.push(await inProcessBatched(model, encode(take(perRound.batched)), MAX_BATCH_ROWS));
        for (const c of CONCURRENCY) {
          const before = batchRows.length;
          const k = concurrent.get(c)!;
          k.runs.push(await overHttp(server.url, take(perRound.concurrent(c)), c));
          k.batches.push(...batchRows.slice(before));
        }
        continuous.push(await overHttp(continuousServer.url, take(perRound.concurrent(wide)), wide));
        batchedWide.push(await inProcessBatched(model, encode(take(perRound.concurrent(wide))), wide));
      }
      const refRun = pool(ref);
      const seqRun = pool(sequential);
      const batchedRun = pool(batched);
      const perToken = (run: Run) => tokens(run) / run.samples.length;
      for (const [name, run] of [['generateBatch', batchedRun], ['1 at a time over HTTP', seqRun], ...CONCURRENCY.map((c) => [`${c} in flight`, pool(concurrent.get(c)!.runs)] as const)] as const) {
        if (perToken(run) !== perToken(refRun)) log(`${name}: ${perToken(run).toFixed(2)} tokens per request, generate ${perToken(refRun).toFixed(2)}`);
      }

      const refRps = rps(refRun);
      const refMed = quantile(ttfts(refRun), 0.5);
      const refP90 = quantile(ttfts(refRun), 0.9);
      const generateRef = 'generate, 1 at a time, in process';
      const rows: Row[] = [];
      const add = (label: string, run: Run) => {
        const med = quantile(ttfts(run), 0.5);
        const p90 = quantile(ttfts(run), 0.9);
        rows.push(
          { section: 'serve', case: `${label}: requests/s`, value: rps(run), unit: 'req/s', reference: generateRef, referenceValue: refRps, ratio: rps(run) / refRps },
          { section: 'serve', case: `${label}: TTFT median`, value: med, unit: 'ms', reference: generateRef, referenceValue: refMed, ratio: med / refMed },
          { section: 'serve', case: `${label}: TTFT p90`, value: p90, unit: 'ms', reference: generateRef, referenceValue: refP90, ratio: p90 / refP90 },
        );
      };
      add(`generateBatch, ${MAX_BATCH_ROWS} rows a batch, in process (GPT-2 4x128, ${backendLabel}, ${NEW_TOKENS} tokens)`, batchedRun);
      add('serve, 1 request at a time (streamed, fetch)', seqRun);
      const overhead = 1000 / rps(seqRun) - 1000 / refRps;
      rows.push({
        section: 'serve', case: 'serve, 1 request at a time: overhead per request', value: overhead, unit: 'ms',
        reference: 'generate time per request', referenceValue: 1000 / refRps, ratio: overhead / (1000 / refRps),
      });
      for (const c of CONCURRENCY) {
        const k = concurrent.get(c)!;
        const run = pool(k.runs);
        add(`serve, ${c} clients in flight`, run);
        rows.push(
          {
            section: 'serve', case: `serve, ${c} clients in flight: requests/s vs generateBatch`, value: rps(run), unit: 'req/s',
            reference: `generateBatch, ${MAX_BATCH_ROWS} rows a batch`, referenceValue: rps(batchedRun), ratio: rps(run) / rps(batchedRun),
          },
          {
            section: 'serve', case: `serve, ${c} clients in flight: rows per batch (mean)`, value: mean(k.batches), unit: 'rows',
            reference: 'MAX_BATCH_ROWS', referenceValue: MAX_BATCH_ROWS, ratio: mean(k.batches) / MAX_BATCH_ROWS,
          },
        );
        log(`${c} clients in flight: batches (how many of how many rows): ${histogram(k.batches)}`);
      }
      // continuous batching against generateBatch of as many rows at once (the #48 target: ≥ 0.8×); its time to first
      // token in steps of the running batch (a step: the run's time over its tokens per row)
      const cont = pool(continuous);
      const wideRun = pool(batchedWide);
      add(`serve, continuous batching, ${wide} clients in flight`, cont);
      const tokensPerSecond = (run: Run) => tokens(run) / run.seconds;
      const stepMs = (1000 * cont.seconds) / (tokens(cont) / wide);
      rows.push(
        {
          section: 'serve', case: `serve, continuous batching, ${wide} clients: tokens/s vs generateBatch of ${wide} rows`, value: tokensPerSecond(cont),
          unit: 'tok/s', reference: `generateBatch, ${wide} rows a batch, in process`, referenceValue: tokensPerSecond(wideRun),
          ratio: tokensPerSecond(cont) / tokensPerSecond(wideRun), target: '≥ 0.8×',
        },
        {
          section: 'serve', case: `serve, continuous batching, ${wide} clients: TTFT median in steps of the running batch`,
          value: quantile(ttfts(cont), 0.5) / stepMs, unit: 'steps', reference: 'target', referenceValue: 2, ratio: quantile(ttfts(cont), 0.5) / stepMs / 2,
          target: '≤ 2 steps',
        },
      );
      return rows;
    } finally {
      await server.close();
      await continuousServer.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const mean = (v: number[]) => v.reduce((a, b) => a + b, 0) / v.length;

/** "12 of 1, 11 of 7, 30 of 8": how many batches had each number of rows. */
function histogram(sizes: number[]): string {
  const counts = new Map<number, number>();
  for (const s of sizes) counts.set(s, (counts.get(s) ?? 0) + 1);
  return [...counts].sort((a, b) => a[0] - b[0]).map(([size, count]) => `${count} of ${size}`).join(', ');
}
