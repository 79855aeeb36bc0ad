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

function argmax(logits: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  return best;
}

/**
 * Picks the next token from one row of logits: greedy at temperature 0, otherwise
 * temperature → top-k → top-p (as Hugging Face's warpers, in that order) → a draw from
 * the seeded generator.
 */
export function sampleToken(logits: ArrayLike<number>, o: SamplingOptions, rng: Generator): number {
  const temperature = o.temperature ?? 0;
  if (temperature === 0) return argmax(logits);
  const n = logits.length;
  let order = Array.from({ length: n }, (_, i) => i).sort((a, b) => logits[b] - logits[a] || a - b);
  const k = o.topK ?? 0;
  if (k > 0 && k < n) order = order.slice(0, k);
  const top = logits[order[0]] / temperature;
  let probs = order.map((i) => Math.exp(logits[i] / temperature - top));
  let total = probs.reduce((a, b) => a + b, 0);
  const p = o.topP ?? 1;
  if (p < 1) {
    let acc = 0;
    let keep = 0;
    while (keep < probs.length) {
      acc += probs[keep] / total;
      keep++;
      if (acc >= p) break;
    }
    order = order.slice(0, keep);
    probs = probs.slice(0, keep);
    total = probs.reduce((a, b) => a + b, 0);
  }
  let u = rng.uniform() * total;
  for (let i = 0; i < probs.length; i++) {
    u -= probs[i];
    if (u < 0) return order[i];
  }
  return order[order.length - 1];
}
