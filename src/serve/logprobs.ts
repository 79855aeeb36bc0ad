import { logSumExp } from '../models/index.ts';

/**
 * Log-probabilities as OpenAI's API returns them: of each chosen token under the model's distribution (the log-softmax
 * of its logits, before temperature or top-p, as vLLM returns them by default), with the likeliest alternatives.
 */

/** One token's text, its UTF-8 bytes (a token may hold part of a character) and its log-probability. */
export interface Alternative {
  token: string;
  logprob: number;
  bytes: number[];
}

export interface TokenLogprob extends Alternative {
  top: Alternative[];
}

/**
 * The log-probability of token `id` under `logits` (log-softmax in float64) and the `top` likeliest tokens' (ties
 * broken by id), each with its text as `text` decodes it alone.
 */
export function tokenLogprob(logits: Float32Array, id: number, top: number, text: (id: number) => string): TokenLogprob {
  const lse = logSumExp(logits);
  const alternative = (i: number): Alternative => {
    const token = text(i);
    return { token, logprob: logits[i] - lse, bytes: [...Buffer.from(token, 'utf8')] };
  };
  const best: number[] = [];
  if (top > 0) {
    // a partial selection: the `top` largest, kept sorted
    for (let i = 0; i < logits.length; i++) {
      if (best.length === top && logits[i] <= logits[best[top - 1]]) continue;
      let at = best.length;
      while (at > 0 && logits[best[at - 1]] < logits[i]) at--;
      best.splice(at, 0, i);
      if (best.length > top) best.pop();
    }
  }
  return { ...alternative(id), top: best.map(alternative) };
}

/** A chat choice's (or chunk's) `logprobs`: `{content: [...], refusal: null}`. */
export function chatLogprobs(entries: readonly TokenLogprob[]): Record<string, unknown> {
  return {
    content: entries.map((e) => ({ token: e.token, logprob: e.logprob, bytes: e.bytes, top_logprobs: e.top })),
    refusal: null,
  };
}

/** A completion choice's (or chunk's) `logprobs` in the legacy shape; `offset`: where the first token's text begins. */
export function completionLogprobs(entries: readonly TokenLogprob[], offset: number): Record<string, unknown> {
  const textOffset: number[] = [];
  let at = offset;
  for (const e of entries) {
    textOffset.push(at);
    at += e.token.length;
  }
  return {
    tokens: entries.map((e) => e.token),
    token_logprobs: entries.map((e) => e.logprob),
    top_logprobs: entries.map((e) => Object.fromEntries(e.top.map((t) => [t.token, t.logprob]))),
    text_offset: textOffset,
  };
}
