import { InvalidArgumentError } from '../../errors.ts';
import { Generator, noGrad, type Tensor, tensor } from '../../tensor/index.ts';
import { type CausalLM, KVCache } from '../model.ts';
import type { GenerateOptions, StepModel } from './generate.ts';
import { argmax, checkSampling, drawWeighted, samplingWeights } from './sampling.ts';

/** How drafts are made: 'lookup' continues the longest recent n-gram that occurred before (prompt lookup decoding). */
export type DraftKind = 'lookup';

/**
 * A maker of drafts: up to `k` tokens that may follow `context`. Drafts are proposed with certainty (a draft model's
 * are its greedy tokens), which is what makes the acceptance rule exact for sampling too.
 */
export interface Drafter {
  draft(context: readonly number[], k: number): number[] | Promise<number[]>;
}

export interface SpeculativeOptions extends GenerateOptions {
  draft: DraftKind | Drafter;
  /** The most tokens drafted for one pass (default 8); the number adapts to how many were accepted. */
  maxDrafts?: number;
  /** The longest n-gram looked up (default 3). */
  ngram?: number;
  /** Asked after every token: true ends the generation there (a reader that left). */
  cancelled?: () => boolean;
}

/** What a speculative generation produced, and how many trips through the model it took. */
export interface SpeculativeResult {
  tokens: number[];
  /** Steps through the model: the prompt's and one per pass of drafts checked. */
  passes: number;
  /** Tokens drafted and checked, and how many of them were accepted. */
  drafted: number;
  accepted: number;
}

/**
 * Drafts for prompt lookup decoding: the tokens that followed an earlier occurrence of the context's longest suffix of
 * `ngram` tokens or fewer (Saxena's prompt lookup; llama.cpp's lookup decoding): the latest occurrence followed by k
 * tokens, else the one followed by the most. None when no suffix occurred before.
 * @example lookupDraft([1, 2, 3, 9, 1, 2], 3, 4) // [3, 9, 1, 2]
 */
export function lookupDraft(context: readonly number[], ngram: number, k: number): number[] {
  const n = context.length;
  if (k <= 0) return [];
  for (let size = Math.min(ngram, n - 1); size >= 1; size--) {
    let best = -1;
    for (let start = n - size - 1; start >= 0; start--) {
      let same = true;
      for (let j = 0; j < size && same; j++) same = context[start + j] === context[n - size + j];
      if (!same) continue;
      // what follows the match (it may run into the suffix itself: a loop continues)
      if (best < 0 || start < best) best = start;
      if (n - (start + size) >= k) break;
    }
    if (best >= 0) return context.slice(best + size, Math.min(n, best + size + k));
  }
  return [];
}

/**
 * Generation of one prompt that checks several drafted tokens per step through the model (speculative decoding,
 * Leviathan et al. 2023, Chen et al. 2023): each pass feeds the next token and up to k drafts as one step and keeps
 * the drafts the model agrees with; the cache then drops the positions after the last accepted one
 * (`stepModel.truncate`). Greedy, the tokens are the model's greedy ones (bit for bit where a step's positions do not
 * depend on how many come with it, as on js). Sampling, a draft d (drafted with certainty) is accepted with the
 * model's probability p(d) and otherwise replaced by a draw from p without d: the tokens follow the model's
 * distribution (not the same draws as without speculation).
 */
export async function generateSpeculative(stepModel: StepModel, prompt: number[], options: SpeculativeOptions): Promise<SpeculativeResult> {
  checkSampling(options);
  if (!stepModel.truncate) throw new InvalidArgumentError('this model cannot drop cached positions: speculative decoding needs it');
  if (typeof options.draft === 'string' && options.draft !== 'lookup') throw new InvalidArgumentError(`unknown draft '${options.draft}' (lookup)`);
  const drafter: Drafter = typeof options.draft === 'string' ? { draft: (context, k) => lookupDraft(context, options.ngram ?? 3, k) } : options.draft;
  if (prompt.length === 0) throw new InvalidArgumentError('every prompt needs at least one token');
  const maxNew = options.maxNewTokens ?? 32;
  if (!Number.isInteger(maxNew) || maxNew < 0) throw new InvalidArgumentError('maxNewTokens must be a non-negative integer');
  if (prompt.length + maxNew > stepModel.maxPositions) {
    throw new InvalidArgumentError(`prompt (${prompt.length}) + new tokens (${maxNew}) exceed the model's ${stepModel.maxPositions} positions`);
  }
  const maxDrafts = options.maxDrafts ?? 8;
  if (!Number.isInteger(maxDrafts) || maxDrafts < 1) throw new InvalidArgumentError('maxDrafts must be a positive integer');
  const stops = new Set(options.stopTokens ?? (stepModel.eosTokenId === null ? [] : [stepModel.eosTokenId]));
  const rng = new Generator(options.seed ?? 0);
  const greedy = (options.temperature ?? 0) === 0;
  const out: number[] = [];
  const result: SpeculativeResult = { tokens: out, passes: 0, drafted: 0, accepted: 0 };
  if (maxNew === 0) return result;
  const run = async (ids: number[], from: number): Promise<Tensor> => {
    result.passes++;
    const positions = tensor(ids.map((_, i) => from + i), [1, ids.length], 'int32');
    return stepModel.step(tensor(ids, [1, ids.length], 'int32'), { positions, keyMask: null });
  };
  const row = (logits: Tensor, i: number): Float32Array => {
    const v = logits.shape[2];
    return logits.data.subarray(i * v, (i + 1) * v) as Float32Array;
  };
  /** Emits a token picked from `logits`; true when generation ends with it. */
  const emit = async (token: number, logits: Float32Array): Promise<boolean> => {
    out.push(token);
    const pending = options.onToken?.(token, 0, logits, out.length - 1);
    if (pending instanceof Promise) await pending;
    return stops.has(token) || out.length >= maxNew || options.cancelled?.() === true;
  };
  let logits = await run(prompt, 0);
  let position = prompt.length;
  let dist: Float32Array = row(logits, prompt.length - 1);
  let forced: number | null = null;
  let k = Math.min(4, maxDrafts);
  for (;;) {
    const next = forced ?? (greedy ? argmax(dist) : pickFrom(dist, options, rng));
    forced = null;
    if (await emit(next, dist)) return result;
    const context = [...prompt, ...out];
    const room = Math.min(maxNew - out.length, stepModel.maxPositions - position - 1, (stepModel.passLimit?.(position) ?? Infinity) - 1);
    const want = Math.max(0, Math.min(k, room));
    const drafts = want > 0 ? (await drafter.draft(context, want)).slice(0, want) : [];
    logits = await run([next, ...drafts], position);
    result.drafted += drafts.length;
    let kept = 0;
    for (; kept < drafts.length; kept++) {
      const p = row(logits, kept);
      const d = drafts[kept];
      const verdict = greedy ? greedyCheck(p, d) : sampledCheck(p, d, options, rng);
      if (verdict !== null) {
        forced = verdict;
        // the corrected token's logits are this row's, read before the next pass replaces them
        dist = p.slice();
        break;
      }
      result.accepted++;
      if (await emit(d, p)) {
        // the cache keeps what the generation ended at (a later call may not continue this session)
        return result;
      }
    }
    position += kept + 1;
    if (kept < drafts.length) await stepModel.truncate(position);
    if (kept === drafts.length) dist = row(logits, drafts.length);
    // adapt: one more draft after a pass that kept them all, half as many after one that kept few
    if (drafts.length > 0) k = kept === drafts.length ? Math.min(maxDrafts, k + 1) : Math.max(1, Math.min(k, kept + 1));
  }
}

/**
 * A step of `steps` positions cut to its first `keep` (a speculative pass kept to its accepted positions): its tensors
 * [B, T, …] to [B, keep, …], its key mask [B, past + T] to [B, past + keep].
 */
export function cutStep<S extends { positions: Tensor; keyMask: Tensor | null }>(
  step: S, keep: number, tensors: readonly (keyof S)[],
): S {
  const steps = step.positions.shape[1];
  const out = { ...step, positions: step.positions.narrow(1, 0, keep).contiguous() };
  for (const k of tensors) out[k] = (step[k] as Tensor).narrow(1, 0, keep).contiguous() as S[keyof S];
  const m = step.keyMask;
  out.keyMask = m ? m.narrow(1, 0, m.shape[1] - (steps - keep)).contiguous() : null;
  return out;
}

/** Greedy: null when the model's token is the draft, else the model's token. */
function greedyCheck(logits: Float32Array, draft: number): number | null {
  const best = argmax(logits);
  return best === draft ? null : best;
}

/** A draw as sampleToken makes it at temperature > 0. */
function pickFrom(logits: Float32Array, o: SpeculativeOptions, rng: Generator): number {
  const { order, weights, total } = samplingWeights(logits, o);
  return drawWeighted(order, weights, total, rng);
}

/**
 * Sampling: the draft (proposed with probability 1) is kept with the model's probability of it; otherwise a draw from
 * the model's distribution without it, which is max(p − q, 0) normalised for a one-hot q. Null when kept.
 */
function sampledCheck(logits: Float32Array, draft: number, o: SpeculativeOptions, rng: Generator): number | null {
  const { order, weights, total } = samplingWeights(logits, o);
  const at = order.indexOf(draft);
  const p = at < 0 ? 0 : weights[at] / total;
  if (rng.uniform() < p) return null;
  const rest = order.filter((_, i) => i !== at);
  const restWeights = weights.filter((_, i) => i !== at);
  return drawWeighted(rest, restWeights, total - (at < 0 ? 0 : weights[at]), rng);
}

/**
 * A small model of the same vocabulary as a drafter (`generate --draft DIR`): its greedy tokens, with a KV cache of its
 * own that keeps what the last drafts and the text have in common (the text's accepted part is never fed again).
 */
export function modelDrafter(model: CausalLM, vocabSize: number): Drafter {
  if (model.config.vocabSize !== vocabSize) {
    throw new InvalidArgumentError(`the draft model has a vocabulary of ${model.config.vocabSize}, the model ${vocabSize}: they must share the tokenizer`);
  }
  const cache = new KVCache(model.config.layers);
  let fed: number[] = [];
  const forward = (ids: number[], from: number) => noGrad(() => model.forward(tensor(ids, [1, ids.length], 'int32'), {
    cache, positions: tensor(ids.map((_, i) => from + i), [1, ids.length], 'int32'),
  }));
  return {
    draft(context, k) {
      // what the cache holds and the text agree on, short of the text's last token (its logits are needed)
      let common = 0;
      const limit = Math.min(fed.length, context.length - 1);
      while (common < limit && fed[common] === context[common]) common++;
      if (context.length + k > model.config.maxPositions) return [];
      cache.truncate(common);
      let logits = forward(context.slice(common), common);
      fed = [...context];
      const out: number[] = [];
      for (let i = 0; i < k; i++) {
        const v = logits.shape[2];
        const t = logits.shape[1];
        const token = argmax(logits.data.subarray((t - 1) * v, t * v) as Float32Array);
        out.push(token);
        if (i === k - 1) break;
        logits = forward([token], fed.length);
        fed.push(token);
      }
      return out;
    },
  };
}
