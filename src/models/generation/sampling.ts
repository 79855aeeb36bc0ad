import { InvalidArgumentError } from '../../errors.ts';
import type { Generator } from '../../tensor/index.ts';

export interface SamplingOptions {
  /** 0 (default) picks the most likely token; higher values flatten the distribution. */
  temperature?: number;
  /** Keep only the k most likely tokens (0 = all). */
  topK?: number;
  /** Keep the smallest set of tokens whose probabilities add up to p (1 = all). */
  topP?: number;
}

export function checkSampling(o: SamplingOptions): void {
  if ((o.temperature ?? 0) < 0) throw new InvalidArgumentError('temperature must be ≥ 0');
  if ((o.topK ?? 0) < 0 || !Number.isInteger(o.topK ?? 0)) throw new InvalidArgumentError('topK must be a non-negative integer');
  const p = o.topP ?? 1;
  if (!(p > 0 && p <= 1)) throw new InvalidArgumentError('topP must be in (0, 1]');
}

/** log Σ exp(logits), in float64 (stable): a token's log-probability is its logit minus this. */
export function logSumExp(logits: ArrayLike<number>): number {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  return max + Math.log(sum);
}

export function argmax(logits: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  return best;
}

/**
 * The distribution sampling draws from at temperature > 0: temperature → top-k → top-p (as Hugging Face's warpers, in
 * that order), as the tokens kept (most likely first) and their unnormalised weights, with their sum.
 */
export function samplingWeights(logits: ArrayLike<number>, o: SamplingOptions): { order: number[]; weights: number[]; total: number } {
  const temperature = o.temperature ?? 0;
  const n = logits.length;
  let order = Array.from({ length: n }, (_, i) => i).sort((a, b) => logits[b] - logits[a] || a - b);
  const k = o.topK ?? 0;
  if (k > 0 && k < n) order = order.slice(0, k);
  const top = logits[order[0]] / temperature;
  let weights = order.map((i) => Math.exp(logits[i] / temperature - top));
  let total = weights.reduce((a, b) => a + b, 0);
  const p = o.topP ?? 1;
  if (p < 1) {
    let acc = 0;
    let keep = 0;
    while (keep < weights.length) {
      acc += weights[keep] / total;
      keep++;
      if (acc >= p) break;
    }
    order = order.slice(0, keep);
    weights = weights.slice(0, keep);
    total = weights.reduce((a, b) => a + b, 0);
  }
  return { order, weights, total };
}

/** A draw from `order` by `weights` (summing to `total`) with the seeded generator. */
export function drawWeighted(order: readonly number[], weights: readonly number[], total: number, rng: Generator): number {
  let u = rng.uniform() * total;
  for (let i = 0; i < weights.length; i++) {
    u -= weights[i];
    if (u < 0) return order[i];
  }
  return order[order.length - 1];
}

/**
 * Picks the next token from one row of logits: greedy at temperature 0, otherwise
 * temperature → top-k → top-p (as Hugging Face's warpers, in that order) → a draw from
 * the seeded generator.
 */
export function sampleToken(logits: ArrayLike<number>, o: SamplingOptions, rng: Generator): number {
  if ((o.temperature ?? 0) === 0) return argmax(logits);
  const { order, weights, total } = samplingWeights(logits, o);
  return drawWeighted(order, weights, total, rng);
}
