import { InvalidArgumentError, RateLimitedError, TensorLinkError } from '../errors.ts';
import type { ChatMessage } from './chat.ts';
import { ANY_OBJECT, compileSchema, type JsonNode } from './json-grammar.ts';

/**
 * OpenAI's API shapes (completions and chat completions, streamed or not, errors) as TensorLink
 * serves them: request bodies are parsed into typed requests, and every refusal is an
 * ApiError with OpenAI's status code, type and code.
 */

/** An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`. */
export class ApiError extends TensorLinkError {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string,
    readonly code: string | null = null,
    readonly param: string | null = null,
  ) {
    super(message);
    this.name = 'ApiError';
  }

  body(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

export const badRequest = (message: string, param: string | null = null, code: string | null = null) =>
  new ApiError(400, message, 'invalid_request_error', code, param);

/** Any error as the API answers it: ours keep their meaning, anything else is a 500 without internals. */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof RateLimitedError) return new ApiError(429, err.message, 'rate_limit_exceeded', 'rate_limit_exceeded');
  if (err instanceof InvalidArgumentError) return badRequest(err.message);
  if (err instanceof TensorLinkError) return new ApiError(503, `the model could not serve this request: ${err.message}`, 'server_error', 'unavailable');
  return new ApiError(500, 'internal error', 'server_error');
}

/** What both endpoints ask of the model, once parsed. */
export interface Sampling {
  model: string;
  /** null: as many as the context allows. */
  maxTokens: number | null;
  temperature: number;
  topP: number;
  n: number;
  stop: string[];
  seed: number | undefined;
  stream: boolean;
  includeUsage: boolean;
  /** Log-probabilities of the chosen tokens, with this many of the likeliest beside each; null: none. */
  logprobs: number | null;
  /** `response_format` json_object or json_schema: the grammar every choice's text follows; null: free text. */
  json: JsonNode | null;
}

export interface CompletionRequest extends Sampling {
  /** Text, or token ids (OpenAI's `prompt` as an array of integers, or of such arrays). */
  prompts: (string | number[])[];
  echo: boolean;
}

export interface ChatRequest extends Sampling {
  messages: ChatMessage[];
}

/** Most choices per request (`n`) and most stop strings, as OpenAI allows. */
export const MAX_N = 8;
export const MAX_STOPS = 4;
/** Most prompts in one completion request. */
export const MAX_PROMPTS = 8;
/** Most alternatives a token's log-probabilities list: chat's `top_logprobs` and completions' `logprobs`, as OpenAI allows. */
export const MAX_TOP_LOGPROBS = 20;
export const MAX_COMPLETION_LOGPROBS = 5;

type Body = Record<string, unknown>;

function num(body: Body, key: string, fallback: number, min: number, max: number): number {
  const v = body[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) throw badRequest(`'${key}' must be a number in [${min}, ${max}], got ${JSON.stringify(v)}`, key);
  return v;
}

function int(body: Body, key: string, min: number, max: number): number | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) throw badRequest(`'${key}' must be an integer in [${min}, ${max}], got ${JSON.stringify(v)}`, key);
  return v;
}

function sampling(body: unknown): Sampling & { body: Body } {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw badRequest('the request body must be a JSON object');
  const b = body as Body;
  if (typeof b.model !== 'string' || b.model.length === 0) throw badRequest('\'model\' is required: the id of a model of GET /v1/models', 'model');
  const stream = b.stream ?? false;
  if (typeof stream !== 'boolean') throw badRequest('\'stream\' must be true or false', 'stream');
  let stop: string[] = [];
  if (typeof b.stop === 'string') stop = [b.stop];
  else if (Array.isArray(b.stop)) stop = b.stop as string[];
  else if (b.stop !== undefined && b.stop !== null) throw badRequest('\'stop\' must be a string or an array of strings', 'stop');
  if (stop.length > MAX_STOPS || stop.some((s) => typeof s !== 'string' || s.length === 0)) throw badRequest(`'stop' holds at most ${MAX_STOPS} non-empty strings`, 'stop');
  const options = b.stream_options as { include_usage?: unknown } | undefined | null;
  const maxTokens = int(b, 'max_completion_tokens', 0, 1 << 20) ?? int(b, 'max_tokens', 0, 1 << 20) ?? null;
  return {
    body: b,
    model: b.model,
    maxTokens,
    temperature: num(b, 'temperature', 1, 0, 2),
    topP: num(b, 'top_p', 1, Number.MIN_VALUE, 1),
    n: int(b, 'n', 1, MAX_N) ?? 1,
    stop,
    seed: int(b, 'seed', -(2 ** 53), 2 ** 53),
    stream,
    includeUsage: stream && options?.include_usage === true,
    logprobs: null,
    json: responseFormat(b.response_format),
  };
}

/** `response_format`: text (or none), json_object, or json_schema with the schema its choices follow. */
function responseFormat(v: unknown): JsonNode | null {
  if (v === undefined || v === null) return null;
  const f = v as { type?: unknown; json_schema?: { schema?: unknown } | null };
  if (typeof f !== 'object' || Array.isArray(f)) throw badRequest('\'response_format\' must be an object', 'response_format');
  if (f.type === 'text') return null;
  if (f.type === 'json_object') return ANY_OBJECT;
  if (f.type !== 'json_schema') throw badRequest('\'response_format.type\' must be text, json_object or json_schema', 'response_format');
  if (typeof f.json_schema !== 'object' || f.json_schema === null) throw badRequest('json_schema needs \'json_schema\': {name, schema}', 'response_format');
  try {
    return compileSchema(f.json_schema.schema ?? {});
  } catch (err) {
    throw badRequest((err as Error).message, 'response_format');
  }
}

/** POST /v1/completions. */
export function parseCompletion(body: unknown): CompletionRequest {
  const s = sampling(body);
  const p = s.body.prompt;
  const isIds = (x: unknown): x is number[] =>
    Array.isArray(x) && x.length > 0 && x.every((i) => Number.isInteger(i) && (i as number) >= 0);
  let prompts: (string | number[])[] | null = null;
  if (typeof p === 'string') prompts = [p];
  else if (isIds(p)) prompts = [p];
  else if (Array.isArray(p) && p.every((x) => typeof x === 'string' || isIds(x))) prompts = p as (string | number[])[];
  if (prompts === null || prompts.length === 0) {
    throw badRequest('\'prompt\' must be a string, token ids (non-negative integers), or a non-empty array of either', 'prompt');
  }
  if (prompts.length > MAX_PROMPTS) throw badRequest(`at most ${MAX_PROMPTS} prompts in one request`, 'prompt');
  if (prompts.length * s.n > MAX_N) throw badRequest(`prompts × n is at most ${MAX_N}`, 'n');
  const echo = s.body.echo ?? false;
  if (typeof echo !== 'boolean') throw badRequest('\'echo\' must be true or false', 'echo');
  // the legacy shape: `logprobs` N asks for the chosen token's and the N likeliest
  const logprobs = int(s.body, 'logprobs', 0, MAX_COMPLETION_LOGPROBS) ?? null;
  // OpenAI's default for completions is 16 tokens
  return { ...s, maxTokens: s.maxTokens ?? 16, prompts, echo, logprobs };
}

const ROLES = new Set(['system', 'user', 'assistant', 'developer', 'tool']);

/** POST /v1/chat/completions. */
export function parseChat(body: unknown): ChatRequest {
  const s = sampling(body);
  const m = s.body.messages;
  if (!Array.isArray(m) || m.length === 0) throw badRequest('\'messages\' must be a non-empty array', 'messages');
  const messages = m.map((x: unknown, i): ChatMessage => {
    const msg = x as { role?: unknown; content?: unknown } | null;
    if (typeof msg !== 'object' || msg === null || typeof msg.role !== 'string' || !ROLES.has(msg.role)) {
      throw badRequest(`messages[${i}] needs a role: one of ${[...ROLES].join(', ')}`, `messages[${i}].role`);
    }
    let content: string;
    if (typeof msg.content === 'string') content = msg.content;
    else if (Array.isArray(msg.content) && msg.content.every((p) => p?.type === 'text' && typeof p.text === 'string')) {
      content = (msg.content as { text: string }[]).map((p) => p.text).join('');
    } else throw badRequest(`messages[${i}].content must be text (a string, or parts of type 'text')`, `messages[${i}].content`);
    return { role: msg.role as ChatMessage['role'], content };
  });
  const wanted = s.body.logprobs ?? false;
  if (typeof wanted !== 'boolean') throw badRequest('\'logprobs\' must be true or false', 'logprobs');
  const top = int(s.body, 'top_logprobs', 0, MAX_TOP_LOGPROBS);
  if (top !== undefined && !wanted) throw badRequest('\'top_logprobs\' needs \'logprobs\': true', 'top_logprobs');
  return { ...s, messages, logprobs: wanted ? (top ?? 0) : null };
}

/** The 400 of a prompt that leaves no room, in the words OpenAI uses. */
export function contextError(limit: number, prompt: number, completion: number): ApiError {
  return badRequest(
    `This model's maximum context length is ${limit} tokens. However, you requested ${prompt + completion} tokens `
    + `(${prompt} in the messages, ${completion} in the completion). Please reduce the length of the messages or completion.`,
    'messages',
    'context_length_exceeded',
  );
}

export type FinishReason = 'stop' | 'length';

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export const usage = (prompt: number, completion: number): Usage => ({
  prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion,
});
