import { randomBytes, randomInt } from 'node:crypto';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { type CausalLM, promptIds, type Tokenizer } from '../models/index.ts';
import type { ChatFormat } from './chat.ts';
import {
  ApiError, badRequest, type ChatRequest, type CompletionRequest, contextError, type FinishReason, parseChat, parseCompletion,
  type Sampling, toApiError, usage,
} from './openai.ts';
import { type BatchRunner, type Row, Scheduler } from './scheduler.ts';
import { ContinuousScheduler, type RowScheduler } from './continuous.ts';
import { SessionRows } from './session-rows.ts';
import { TextStream } from './text-stream.ts';
import { chatLogprobs, completionLogprobs, type TokenLogprob, tokenLogprob } from './logprobs.ts';
import { JsonConstraint } from './json-grammar.ts';
import { dashboardRoutes } from './dashboard.ts';
import type { ServingStats } from './metrics.ts';
import type { SpeculativeCounts } from './speculative.ts';
import type { Overview } from '../user/index.ts';

/** A model as the API serves it: in this process or across a swarm, behind one batch runner. */
export interface ServedModel {
  /** Its id in the API (`model` of requests, GET /v1/models). */
  id: string;
  tokenizer: Tokenizer;
  maxPositions: number;
  chat: ChatFormat;
  run: BatchRunner;
  /** Adapters a request may pick by its `model` field, 'ID:NAME' (`serve --adapter NAME=DIR`); each is listed by GET /v1/models. */
  adapters?: readonly string[];
  /** The model itself when it runs in this process (no adapters): its requests are batched continuously (continuous.ts). */
  local?: CausalLM;
  /** What speculative decoding did, when lone rows are decoded speculatively (speculative.ts). */
  speculative?: SpeculativeCounts;
  /**
   * Decodes one row as a session of its own (a hosted model): its requests then batch continuously on the hosts
   * (session-rows.ts) instead of waiting for batches here.
   */
  rows?: (row: Row) => Promise<void>;
}

export interface ServeOptions {
  host?: string;
  /** 0: a free port. */
  port?: number;
  /** Largest request body (default 1 MiB). */
  bodyLimit?: number;
  /** The swarm's overview for the dashboard at / (absent: the dashboard shows this server alone). */
  overview?: () => Promise<Overview>;
}

export interface ApiServer {
  url: string;
  app: FastifyInstance;
  scheduler: RowScheduler;
  /** What it has served so far (the dashboard's and /metrics' figures). */
  stats(): ServingStats;
  close(): Promise<void>;
}

/** Bytes of a request body at most: a chat of a few thousand tokens is far below. */
const BODY_LIMIT = 1 << 20;

/** One choice as it is produced: its text so far and why it ended. */
interface Choice {
  index: number;
  text: TextStream;
  tokens: number;
  finish: FinishReason | null;
  /** Its tokens' log-probabilities (with `logprobs`), and how many of them a stream has sent. */
  logprobs: TokenLogprob[];
  logprobsSent: number;
}

/**
 * The OpenAI-compatible HTTP API (Fastify): GET /v1/models, POST /v1/completions and
 * POST /v1/chat/completions, streamed as server-sent events or answered whole, with usage;
 * errors in OpenAI's shape and status codes. A model in this process batches continuously (continuous.ts), a hosted
 * one too (each row a session of its own, the hosts batching their steps: session-rows.ts); one across the workers of
 * a private job decodes requests in batches, in order (scheduler.ts).
 */
export async function serveApi(model: ServedModel, options: ServeOptions = {}): Promise<ApiServer> {
  const scheduler: RowScheduler = model.local
    ? new ContinuousScheduler(model.local)
    : model.rows ? new SessionRows(model.rows) : new Scheduler(model.run, model.maxPositions);
  const created = Math.floor(Date.now() / 1000);
  // open streams (completions, the dashboard's events) are cut when the server closes
  const app = Fastify({ logger: false, bodyLimit: options.bodyLimit ?? BODY_LIMIT, forceCloseConnections: true });
  const counts = { requests: {} as Record<string, number>, promptTokens: 0, completionTokens: 0, firstToken: { seconds: 0, count: 0 } };
  /** Tokens generated in each of the last seconds (keyed by whole second). */
  const perSecond = new Map<number, number>();
  const counted = (status: number) => (counts.requests[status] = (counts.requests[status] ?? 0) + 1);
  // the API's requests only: the dashboard's page, its state and /metrics scrapes are not served requests
  app.addHook('onResponse', async (req, reply) => {
    if (req.url.startsWith('/v1/')) counted(reply.statusCode);
  });
  const stats = (): ServingStats => {
    const now = Math.floor(Date.now() / 1000);
    let recent = 0;
    for (const [second, n] of perSecond) {
      if (now - second >= 60) perSecond.delete(second);
      else recent += n;
    }
    return {
      model: model.id, ...counts, requests: { ...counts.requests }, firstToken: { ...counts.firstToken }, waiting: scheduler.waiting,
      tokensPerSecond: recent / 60, ...(scheduler.kv ? { kv: scheduler.kv() } : {}),
      ...(model.speculative ? { speculative: { ...model.speculative } } : {}),
    };
  };
  dashboardRoutes(app, { serving: stats, ...(options.overview ? { overview: options.overview } : {}) });
  const send = (reply: FastifyReply, err: unknown) => {
    const e = toApiError(err);
    return reply.code(e.status).send(e.body());
  };
  app.setErrorHandler((err: { statusCode?: number; message: string }, _req, reply) => {
    // Fastify's own refusals (a body that is not JSON, too large, a wrong content type) are the client's
    const status = err.statusCode ?? 500;
    if (status >= 400 && status < 500) return send(reply, new ApiError(status, err.message, 'invalid_request_error'));
    return send(reply, err);
  });
  app.setNotFoundHandler((req, reply) => send(reply, new ApiError(404, `no route ${req.method} ${req.url}`, 'invalid_request_error', 'not_found')));

  // the model, and the model through each of its adapters ('ID:NAME')
  const ids = [model.id, ...(model.adapters ?? []).map((a) => `${model.id}:${a}`)];
  const adapterOf = (id: string): string | null => {
    if (!ids.includes(id)) throw unknownModel(id, ids.join(', '));
    return id === model.id ? null : id.slice(model.id.length + 1);
  };
  const modelCard = (id: string) => ({ id, object: 'model', created, owned_by: 'tensorlink' });
  app.get('/v1/models', async () => ({ object: 'list', data: ids.map(modelCard) }));
  app.get('/v1/models/:id', async (req: FastifyRequest<{ Params: { id: string } }>, reply) => {
    if (!ids.includes(req.params.id)) return send(reply, unknownModel(req.params.id, ids.join(', ')));
    return modelCard(req.params.id);
  });
  app.post('/v1/completions', (req, reply) => respond(req, reply, 'text'));
  app.post('/v1/chat/completions', (req, reply) => respond(req, reply, 'chat'));

  async function respond(req: FastifyRequest, reply: FastifyReply, kind: 'text' | 'chat'): Promise<unknown> {
    let parsed: CompletionRequest | ChatRequest;
    let prompts: (string | number[])[];
    let stops: string[];
    let adapter: string | null;
    try {
      parsed = kind === 'text' ? parseCompletion(req.body) : parseChat(req.body);
      adapter = adapterOf(parsed.model);
      prompts = 'prompts' in parsed ? parsed.prompts : [model.chat.render(parsed.messages)];
      stops = [...parsed.stop, ...(kind === 'chat' ? model.chat.stops : [])];
    } catch (err) {
      return send(reply, err);
    }
    const request = parsed;
    // a client that goes away cancels its rows: they take no more decoding steps
    let gone = false;
    reply.raw.on('close', () => {
      if (!reply.raw.writableFinished) gone = true;
    });
    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomBytes(12).toString('hex')}`;
    const stamp = Math.floor(Date.now() / 1000);
    const echoed = (c: Choice) => {
      if (!('echo' in request && request.echo)) return '';
      const p = prompts[Math.floor(c.index / request.n)];
      return typeof p === 'string' ? p : model.tokenizer.decode(p);
    };
    /** A choice's `logprobs` for `entries` (null without `logprobs`); a completion's offsets count from its echoed prompt. */
    const logprobsOf = (c: Choice, entries: TokenLogprob[], before = 0) => {
      if (request.logprobs === null) return null;
      return kind === 'chat' ? chatLogprobs(entries) : completionLogprobs(entries, echoed(c).length + before);
    };
    // what a streamed request sends as each choice's text grows (nothing for one answered whole)
    let emit: (c: Choice, text: string) => void = () => {};
    let work: { rows: Row[]; choices: Choice[]; promptTokens: number };
    try {
      work = plan(request, prompts, stops, () => gone, (c, text) => emit(c, text), adapter);
    } catch (err) {
      return send(reply, err);
    }
    const { rows, choices } = work;
    const totals = () => usage(work.promptTokens, choices.reduce((sum, c) => sum + c.tokens, 0));
    const tally = () => {
      counts.promptTokens += work.promptTokens;
      counts.completionTokens += choices.reduce((sum, c) => sum + c.tokens, 0);
    };
    const began = performance.now();

    if (!request.stream) {
      try {
        await scheduler.submit(rows);
      } catch (err) {
        return send(reply, err);
      }
      tally();
      const out = choices.map((c) => {
        const finish = c.finish ?? (c.text.stopped ? 'stop' : 'length');
        return kind === 'chat'
          ? { index: c.index, message: { role: 'assistant', content: c.text.text(), refusal: null }, logprobs: logprobsOf(c, c.logprobs), finish_reason: finish }
          : { index: c.index, text: echoed(c) + c.text.text(), logprobs: logprobsOf(c, c.logprobs), finish_reason: finish };
      });
      return { id, object: kind === 'chat' ? 'chat.completion' : 'text_completion', created: stamp, model: request.model, choices: out, usage: totals() };
    }

    // streamed: server-sent events in OpenAI's chunk format, then [DONE]
    const chunk = (choice: Record<string, unknown>[], extra: Record<string, unknown> = {}) => ({
      id, object: kind === 'chat' ? 'chat.completion.chunk' : 'text_completion', created: stamp, model: request.model, choices: choice, ...extra,
    });
    const event = (data: unknown) => {
      if (!gone) reply.raw.write(`data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);
    };
    const piece = (c: Choice, text: string, finish: FinishReason | null) => {
      // the log-probabilities of the tokens since the last chunk (a token whose text is held back comes with a later one)
      const fresh = c.logprobs.slice(c.logprobsSent);
      const before = c.logprobs.slice(0, c.logprobsSent).reduce((n, e) => n + e.token.length, 0);
      c.logprobsSent = c.logprobs.length;
      const logprobs = fresh.length > 0 ? logprobsOf(c, fresh, before) : null;
      return kind === 'chat'
        ? { index: c.index, delta: finish !== null && text === '' ? {} : { content: text }, logprobs, finish_reason: finish }
        : { index: c.index, text, logprobs, finish_reason: finish };
    };
    let submitted: Promise<void>;
    try {
      submitted = scheduler.submit(rows);
    } catch (err) {
      return send(reply, err);
    }
    reply.hijack();
    reply.raw.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'connection': 'keep-alive' });
    for (const c of choices) {
      if (kind === 'chat') event(chunk([{ index: c.index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }]));
      else if (echoed(c)) event(chunk([piece(c, echoed(c), null)]));
    }
    const ended = new Set<Choice>();
    let first = true;
    emit = (c, text) => {
      if (text && first) {
        first = false;
        counts.firstToken.seconds += (performance.now() - began) / 1000;
        counts.firstToken.count++;
      }
      if (text) event(chunk([piece(c, text, null)]));
      if (c.finish && !ended.has(c)) {
        ended.add(c);
        event(chunk([piece(c, '', c.finish)]));
      }
    };
    try {
      await submitted;
      for (const c of choices) {
        if (ended.has(c)) continue;
        c.finish ??= c.text.stopped ? 'stop' : 'length';
        emit(c, c.text.flush());
      }
      if (request.includeUsage) event(chunk([], { usage: totals() }));
    } catch (err) {
      event(toApiError(err).body());
    }
    event('[DONE]');
    tally();
    // a hijacked reply skips Fastify's onResponse hook: counted here
    counted(200);
    if (!gone) reply.raw.end();
    return reply;
  }

  /**
   * The rows a request decodes (n per prompt) and its choices, its lengths checked against the
   * context. A choice ends at the end-of-sequence token, a stop string or its token limit, and
   * then takes no more steps; so does every row of a client that left (`gone`).
   */
  function plan(
    request: Sampling, prompts: (string | number[])[], stops: string[], gone: () => boolean, emit: (c: Choice, text: string) => void,
    adapter: string | null,
  ): { rows: Row[]; choices: Choice[]; promptTokens: number } {
    const tok = model.tokenizer;
    const eos = tok.eosTokenId;
    const decodeOne = (id: number) => tok.decode([id]);
    // constrained decoding: what each token id decodes to alone, read once per tokenizer
    const texts = request.json ? tokenTexts(tok) : null;
    const rows: Row[] = [];
    const choices: Choice[] = [];
    let promptTokens = 0;
    for (const text of prompts) {
      const ids = typeof text === 'string' ? promptIds(tok, text) : text;
      if (ids.length === 0) throw badRequest('the prompt encodes to no tokens', 'prompt');
      const outside = ids.find((id) => id >= tok.vocabSize);
      if (outside !== undefined) throw badRequest(`token id ${outside} is outside the vocabulary of ${tok.vocabSize}`, 'prompt');
      promptTokens += ids.length;
      const room = model.maxPositions - ids.length;
      const wanted = request.maxTokens ?? room;
      if (room < 1 || wanted > room) throw contextError(model.maxPositions, ids.length, Math.max(1, wanted));
      for (let k = 0; k < request.n; k++) {
        const c: Choice = {
          index: choices.length, text: new TextStream((t) => tok.decode(t), stops), tokens: 0, finish: null, logprobs: [], logprobsSent: 0,
        };
        const json = request.json && texts ? new JsonConstraint(request.json, texts, eos) : null;
        choices.push(c);
        rows.push({
          prompt: ids,
          adapter,
          options: {
            maxNewTokens: wanted,
            temperature: request.temperature,
            topP: request.topP,
            // a seed makes a request repeatable; each of its n choices draws from its own generator
            seed: (request.seed ?? randomInt(2 ** 47)) + k,
            cancelled: () => c.finish !== null || gone(),
            ...(json ? { mask: (logits: Float32Array) => json.mask(logits) } : {}),
          },
          onToken: (token, logits) => {
            if (c.finish) return;
            c.tokens++;
            if (request.logprobs !== null && token !== eos) c.logprobs.push(tokenLogprob(logits, token, request.logprobs, decodeOne));
            const second = Math.floor(Date.now() / 1000);
            if (!perSecond.has(second)) for (const s of perSecond.keys()) if (second - s >= 60) perSecond.delete(s);
            perSecond.set(second, (perSecond.get(second) ?? 0) + 1);
            let shown: string;
            json?.advance(token);
            if (token === eos) {
              c.finish = 'stop';
              shown = c.text.flush();
            } else {
              shown = c.text.push(token);
              // a JSON document that is whole ends its choice
              if (c.text.stopped || json?.complete) c.finish = 'stop';
              else if (c.tokens >= wanted) c.finish = 'length';
              if (c.finish) shown += c.text.flush();
            }
            emit(c, shown);
          },
        });
      }
    }
    return { rows, choices, promptTokens };
  }

  const address = await app.listen({ host: options.host ?? '127.0.0.1', port: options.port ?? 0 });
  return { url: address, app, scheduler, stats, close: () => app.close() };
}

function unknownModel(asked: string, served: string): ApiError {
  return new ApiError(404, `The model '${asked}' does not exist: this server serves '${served}'`, 'invalid_request_error', 'model_not_found', 'model');
}

const TOKEN_TEXTS = new WeakMap<Tokenizer, string[]>();

/** What each token id of `tok` decodes to alone (constrained decoding tries them on the grammar). */
function tokenTexts(tok: Tokenizer): string[] {
  let t = TOKEN_TEXTS.get(tok);
  if (!t) TOKEN_TEXTS.set(tok, (t = Array.from({ length: tok.vocabSize }, (_, id) => tok.decode([id]))));
  return t;
}
