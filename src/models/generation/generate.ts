import { InvalidArgumentError } from '../../errors.ts';
import { Generator, noGrad, type Tensor, tensor } from '../../tensor/index.ts';
import { type CausalLM, type ForwardOptions, KVCache } from '../model.ts';
import { checkSampling, type SamplingOptions, sampleToken } from './sampling.ts';

export interface GenerateOptions extends SamplingOptions {
  /** Tokens to add at most (default 32). */
  maxNewTokens?: number;
  /** Seed of the sampling generator (default 0): the same seed gives the same tokens. */
  seed?: number;
  /** Generation of a sequence ends after one of these (default: the model's end-of-sequence token). */
  stopTokens?: number[];
  /**
   * Called for every new token as it is produced (streaming), with the logits it was picked from (the model's, before
   * temperature or top-k/top-p; valid during the call). A promise it returns holds the next step until it settles
   * (back-pressure: a reader that cannot keep up, or a caller that acts between two tokens). `index`: the token's place
   * among its sequence's new tokens (from 0). A generation run again from its start (a worker caught, its result
   * discarded) calls it again from index 0.
   */
  onToken?: (token: number, sequence: number, logits: Float32Array, index: number) => unknown;
  /**
   * Settings of each prompt of a batch (one per prompt), over the shared ones: its own sampling,
   * seed (its own generator, so a row's tokens do not depend on the rows beside it), length,
   * stop tokens, and `cancelled` (asked before every step: true ends that row, as a stop token
   * does). The batch ends when every row has.
   */
  rows?: RowOptions[];
}

/** One prompt's settings in a batch (see GenerateOptions.rows). */
export interface RowOptions extends SamplingOptions {
  /** The logits sampling draws from, given the model's (constrained decoding: what may not come next at −∞). */
  mask?: (logits: Float32Array) => Float32Array;
  maxNewTokens?: number;
  seed?: number;
  stopTokens?: number[];
  cancelled?: () => boolean;
}

/**
 * The model call that generation drives: logits for the new tokens given the cache
 * state. Local models implement it with `forward`; a distributed model with its chain.
 */
export interface StepModel {
  readonly maxPositions: number;
  readonly eosTokenId: number | null;
  step(ids: Tensor, options: ForwardOptions): Promise<Tensor> | Tensor;
  /** Keeps the first `length` positions of the session's cache (speculative decoding drops rejected drafts). */
  truncate?(length: number): Promise<void> | void;
  /** The most positions one step starting at `position` may hold (a boundary the model's records keep), if any. */
  passLimit?(position: number): number;
}

export function localStepModel(model: CausalLM): StepModel {
  const cache = new KVCache(model.config.layers);
  return {
    maxPositions: model.config.maxPositions,
    eosTokenId: model.tokenizer?.eosTokenId ?? model.config.eosTokenId ?? null,
    step: (ids, options) => noGrad(() => model.forward(ids, { ...options, cache })),
    truncate: (length) => cache.truncate(length),
  };
}

/** Row-wise last-position logits of [B, T, V] as arrays. */
function lastLogits(logits: Tensor): Float32Array[] {
  const [b, t, v] = logits.shape;
  return Array.from({ length: b }, (_, i) => logits.data.subarray((i * t + t - 1) * v, (i * t + t) * v) as Float32Array);
}

/**
 * Continues a batch of prompts of different lengths (left-padded under a key mask, each
 * with its own positions), one token per step, reusing the KV cache so the prompt is
 * never recomputed.
 */
export async function generateWith(stepModel: StepModel, prompts: number[][], options: GenerateOptions = {}): Promise<number[][]> {
  checkSampling(options);
  if (options.rows !== undefined && options.rows.length !== prompts.length) {
    throw new InvalidArgumentError(`${options.rows.length} row settings for ${prompts.length} prompts`);
  }
  const rows = prompts.map((_, i) => ({ ...options, ...options.rows?.[i] }));
  for (const r of rows) checkSampling(r);
  const limits = rows.map((r) => r.maxNewTokens ?? 32);
  if (limits.some((n) => !Number.isInteger(n) || n < 0)) throw new InvalidArgumentError('maxNewTokens must be a non-negative integer');
  const maxNew = Math.max(0, ...limits);
  if (prompts.length === 0 || prompts.some((p) => p.length === 0)) throw new InvalidArgumentError('every prompt needs at least one token');
  const longest = Math.max(...prompts.map((p) => p.length));
  if (longest + maxNew > stepModel.maxPositions) {
    throw new InvalidArgumentError(`prompt (${longest}) + new tokens (${maxNew}) exceed the model's ${stepModel.maxPositions} positions`);
  }
  const eos = stepModel.eosTokenId === null ? [] : [stepModel.eosTokenId];
  const stops = rows.map((r) => new Set(r.stopTokens ?? eos));
  // one generator for the batch, as before; a row with its own seed draws from its own
  const shared = new Generator(options.seed ?? 0);
  const rngs = rows.map((_, i) => (options.rows?.[i]?.seed === undefined ? shared : new Generator(options.rows[i].seed)));
  const b = prompts.length;
  // Prefill: left-pad to the longest prompt.
  const ids = new Int32Array(b * longest);
  const mask: number[][] = prompts.map((p) => [...new Array<number>(longest - p.length).fill(0), ...p.map(() => 1)]);
  const positions = new Int32Array(b * longest);
  prompts.forEach((p, i) => {
    const pad = longest - p.length;
    p.forEach((tok, j) => {
      ids[i * longest + pad + j] = tok;
      positions[i * longest + pad + j] = j;
    });
  });
  const padded = prompts.some((p) => p.length !== longest);
  const keyMask = () => (padded ? tensor(mask.flat(), [b, mask[0].length], 'int32') : null);
  let logits = await stepModel.step(tensor(ids, [b, longest], 'int32'), {
    keyMask: keyMask(),
    positions: tensor(positions, [b, longest], 'int32'),
  });
  const outputs: number[][] = prompts.map(() => []);
  const done = limits.map((n, i) => n === 0 || rows[i].cancelled?.() === true);
  const nextPos = prompts.map((p) => p.length);
  for (let step = 0; step < maxNew; step++) {
    if (done.every(Boolean)) break;
    const last = lastLogits(logits);
    const next = last.map((row, i) => (done[i] ? 0 : sampleToken(rows[i].mask ? rows[i].mask(row) : row, rows[i], rngs[i])));
    const held: Promise<unknown>[] = [];
    next.forEach((tok, i) => {
      if (done[i]) return;
      outputs[i].push(tok);
      const pending = options.onToken?.(tok, i, last[i], outputs[i].length - 1);
      if (pending instanceof Promise) held.push(pending);
      if (stops[i].has(tok) || outputs[i].length >= limits[i]) done[i] = true;
    });
    if (held.length > 0) await Promise.all(held);
    // a row whose reader went away ends here (its tokens so far stand)
    rows.forEach((r, i) => {
      if (!done[i] && r.cancelled?.() === true) done[i] = true;
    });
    if (done.every(Boolean) || step === maxNew - 1) break;
    for (const m of mask) m.push(1);
    logits = await stepModel.step(tensor(next, [b, 1], 'int32'), {
      keyMask: keyMask(),
      positions: tensor(nextPos.map((p) => p), [b, 1], 'int32'),
    });
    for (let i = 0; i < b; i++) nextPos[i]++;
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
  return outputs;
}

/**
 * Generates a continuation of one prompt.
 * @example
 * const { tokens } = await generate(model, [15496, 11], { maxNewTokens: 16, temperature: 0 })
 */
export async function generate(model: CausalLM, prompt: number[], options: GenerateOptions = {}): Promise<{ tokens: number[] }> {
  const [tokens] = await generateWith(localStepModel(model), [prompt], options);
  return { tokens };
}

/** Generates continuations of several prompts at once (they may differ in length). */
export async function generateBatch(model: CausalLM, prompts: number[][], options: GenerateOptions = {}): Promise<{ tokens: number[][] }> {
  return { tokens: await generateWith(localStepModel(model), prompts, options) };
}
