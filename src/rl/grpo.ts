/**
 * GRPO's objective (Shao et al., DeepSeekMath, 2024), with Dr. GRPO's (Liu et al., 2025) and DAPO's (Yu et al., 2025)
 * fixes as options. Pure tensor code: the policy's log-probabilities of the completions' tokens come in, a scalar
 * loss goes out, and its gradient flows back into the policy (its LoRA factors) through them.
 *
 * For a group of G completions o_1..o_G of one prompt with rewards r_1..r_G:
 * - advantage Â_i = (r_i − mean r) / (std r + 1e-4) (GRPO; std unbiased, as TRL takes it), or r_i − mean r
 *   (Dr. GRPO: no scaling by the group's spread, which favours questions that are too easy or too hard);
 * - per token, ρ = π_θ(o_t) / π_old(o_t) (π_old: the policy that generated the rollouts, a step behind when generation
 *   overlaps training), and the clipped surrogate min(ρ Â, clip(ρ, 1 − ε_low, 1 + ε_high) Â) (GRPO: ε_low = ε_high
 *   = 0.2; DAPO's clip-higher: ε_high = 0.28);
 * - minus β times the KL to the reference policy, by the k3 estimator π_ref/π_θ − log(π_ref/π_θ) − 1 (unbiased, ≥ 0);
 * - the loss the negative of that, averaged: over each completion's tokens then over completions (GRPO: 'sequence'),
 *   over every token of the batch (DAPO: 'token', long completions weigh per token as short ones), or summed over a
 *   constant G × maxTokens (Dr. GRPO: 'constant', no length bias at all).
 */
import { InvalidArgumentError } from '../errors.ts';
import { gather, type Tensor, tensor } from '../tensor/index.ts';

/** How rewards become advantages within a group: GRPO's scaling by the group's spread, or Dr. GRPO's none. */
export type AdvantageScale = 'group-std' | 'none';
/** How per-token losses are averaged (see the module's comment). */
export type LossAggregation = 'sequence' | 'token' | 'constant';

export interface GrpoOptions {
  /** ε_low: the ratio is clipped below at 1 − ε_low (default 0.2). */
  clipLow?: number;
  /** ε_high: the ratio is clipped above at 1 + ε_high (default clipLow; DAPO: 0.28). */
  clipHigh?: number;
  /** β, the KL term's weight against the reference policy (default 0.04, DeepSeekMath's; 0 needs no reference). */
  beta?: number;
  /** Default 'sequence' (GRPO). */
  aggregation?: LossAggregation;
  /** With aggregation 'constant': the tokens each completion may have (Dr. GRPO's constant). */
  maxTokens?: number;
}

/** GRPO as DeepSeekMath runs it; Dr. GRPO and DAPO as their papers change it. */
export const GRPO_PRESETS = {
  'grpo': { clipLow: 0.2, clipHigh: 0.2, beta: 0.04, aggregation: 'sequence', scale: 'group-std' },
  'dr-grpo': { clipLow: 0.2, clipHigh: 0.2, beta: 0, aggregation: 'constant', scale: 'none' },
  'dapo': { clipLow: 0.2, clipHigh: 0.28, beta: 0, aggregation: 'token', scale: 'group-std' },
} as const satisfies Record<string, Required<Omit<GrpoOptions, 'maxTokens'>> & { scale: AdvantageScale }>;
export type GrpoPreset = keyof typeof GRPO_PRESETS;

/** The std's floor in GRPO's advantages (TRL's): a group of equal rewards has advantages 0, not NaN. */
export const ADVANTAGE_EPS = 1e-4;

/**
 * Each completion's advantage from the rewards of its group: `rewards` holds groups of `groupSize` in a row (the
 * completions of one prompt together).
 */
export function groupAdvantages(rewards: readonly number[], groupSize: number, scale: AdvantageScale = 'group-std'): Float64Array {
  if (!Number.isInteger(groupSize) || groupSize < 2) throw new InvalidArgumentError(`a group needs 2 completions or more, got ${groupSize}`);
  if (rewards.length % groupSize !== 0) {
    throw new InvalidArgumentError(`${rewards.length} rewards are not whole groups of ${groupSize}`);
  }
  const out = new Float64Array(rewards.length);
  for (let g = 0; g < rewards.length; g += groupSize) {
    const group = rewards.slice(g, g + groupSize);
    if (group.some((r) => !Number.isFinite(r))) throw new InvalidArgumentError(`a reward is not a finite number: ${group.join(', ')}`);
    const mean = group.reduce((a, b) => a + b, 0) / groupSize;
    const std = Math.sqrt(group.reduce((a, r) => a + (r - mean) ** 2, 0) / (groupSize - 1));
    for (let i = 0; i < groupSize; i++) out[g + i] = scale === 'none' ? group[i] - mean : (group[i] - mean) / (std + ADVANTAGE_EPS);
  }
  return out;
}

/**
 * log π(token) of each next token: `logits` [N, T, V] and `targets` [N, T] (int32; the token that followed each
 * position). Differentiable in the logits.
 */
export function tokenLogprobs(logits: Tensor, targets: Tensor): Tensor {
  const [n, t] = logits.shape;
  if (targets.shape.length !== 2 || targets.shape[0] !== n || targets.shape[1] !== t) {
    throw new InvalidArgumentError(`targets of shape [${targets.shape}] for logits of shape [${logits.shape}]`);
  }
  return gather(logits.logSoftmax(-1), 2, targets.reshape([n, t, 1])).reshape([n, t]);
}

/** What the objective needs beside the policy's log-probabilities, each [N, T] flat (row-major) but the advantages. */
export interface GrpoBatch {
  /**
   * log π_old of each token: the policy that generated it (the rollouts' own log-probabilities). Absent: on-policy,
   * π_old is π_θ itself (its values, without gradient: every ratio is 1, as TRL takes it for one update per batch).
   */
  oldLogprobs?: ArrayLike<number>;
  /** log π_ref of each token (with β > 0). */
  refLogprobs?: ArrayLike<number>;
  /** 1 where a position holds a completion's token, 0 for prompts and padding. */
  mask: ArrayLike<number>;
  /** One per completion (row). */
  advantages: ArrayLike<number>;
}

export interface GrpoStats {
  /** Share of the completions' tokens whose ratio was clipped (the surrogate took the clipped side). */
  clipped: number;
  /** The mean of the k3 KL estimate over the completions' tokens (0 with β = 0 and no reference). */
  kl: number;
  /** The mean ratio π_θ / π_old over the completions' tokens (1 when on-policy). */
  ratio: number;
  /** Tokens counted. */
  tokens: number;
}

/**
 * GRPO's loss over a batch of completions: `logprobs` are the policy's (log π_θ, with gradient), the rest constants
 * (GrpoBatch, each over the whole batch's N rows). `rows`: the rows [start, end) `logprobs` hold (a micro-batch; default
 * all N), whose share of the batch's loss is returned (the averages are the whole batch's: the shares add up to it).
 * Returns the scalar loss (minimise it) and what it saw in those rows.
 */
export function grpoLoss(
  logprobs: Tensor, batch: GrpoBatch, options: GrpoOptions = {}, rows?: readonly [number, number],
): { loss: Tensor; stats: GrpoStats } {
  const n = batch.advantages.length;
  const t = logprobs.shape[1];
  const size = n * t;
  const [from, to] = rows ?? [0, n];
  const clipLow = options.clipLow ?? 0.2;
  const clipHigh = options.clipHigh ?? clipLow;
  const beta = options.beta ?? 0.04;
  const aggregation = options.aggregation ?? 'sequence';
  if (logprobs.shape.length !== 2) throw new InvalidArgumentError(`log-probabilities of shape [${logprobs.shape}], not [N, T]`);
  if (!(Number.isInteger(from) && from >= 0 && to <= n && logprobs.shape[0] === to - from)) {
    throw new InvalidArgumentError(`log-probabilities of ${logprobs.shape[0]} rows for rows [${from}, ${to}) of ${n} completions`);
  }
  for (const [name, a] of [['oldLogprobs', batch.oldLogprobs], ['mask', batch.mask], ['refLogprobs', batch.refLogprobs]] as const) {
    if (a !== undefined && a.length !== size) throw new InvalidArgumentError(`${name} holds ${a.length} values for [${n}, ${t}]`);
  }
  if (beta > 0 && !batch.refLogprobs) throw new InvalidArgumentError('a KL term (beta > 0) needs the reference policy\'s log-probabilities');
  if (!(clipLow >= 0 && clipLow < 1 && clipHigh >= 0)) throw new InvalidArgumentError(`clip range [1 - ${clipLow}, 1 + ${clipHigh}]`);
  if (aggregation === 'constant' && !(options.maxTokens !== undefined && options.maxTokens >= 1)) {
    throw new InvalidArgumentError('aggregation \'constant\' (Dr. GRPO) needs maxTokens, the tokens a completion may have');
  }

  // each token's weight in the average (the whole batch's), and the surrogate's side: where the clipped side is the
  // minimum, the token's objective is the constant clip(ρ) Â and passes no gradient (as torch's min and clamp do)
  const lp = logprobs.data;
  const local = (to - from) * t;
  const lengths = Array.from({ length: n }, (_, i) => {
    let length = 0;
    for (let j = 0; j < t; j++) if (batch.mask[i * t + j]) length++;
    return length;
  });
  const allTokens = lengths.reduce((a, b) => a + b, 0);
  const weight = new Float64Array(local);
  /** Each token's Â where the surrogate is ρÂ (its gradient's slope), 0 where it is the clipped constant. */
  const slope = new Float64Array(local);
  const clippedValue = new Float64Array(local);
  const old = new Float64Array(local);
  let tokens = 0;
  let clipped = 0;
  let ratioSum = 0;
  let klSum = 0;
  for (let i = from; i < to; i++) {
    for (let j = 0; j < t; j++) {
      const p = i * t + j;
      const q = (i - from) * t + j;
      if (!batch.mask[p]) continue;
      tokens++;
      const a = batch.advantages[i];
      old[q] = batch.oldLogprobs ? batch.oldLogprobs[p] : lp[q];
      const ratio = Math.exp(lp[q] - old[q]);
      const bounded = Math.min(Math.max(ratio, 1 - clipLow), 1 + clipHigh);
      // the minimum of ρÂ and clip(ρ)Â: the clipped side only when it is strictly less
      if (bounded * a < ratio * a) {
        clippedValue[q] = bounded * a;
        clipped++;
      } else slope[q] = a;
      ratioSum += ratio;
      if (batch.refLogprobs) {
        const d = batch.refLogprobs[p] - lp[q];
        klSum += Math.exp(d) - d - 1;
      }
      weight[q] = aggregation === 'sequence' ? 1 / (n * lengths[i]) : aggregation === 'token' ? 1 / allTokens : 1 / (n * options.maxTokens!);
    }
  }

  const shape = [to - from, t];
  const ratio = logprobs.sub(tensor(old, shape, logprobs.dtype)).exp();
  // −(surrogate − β KL), each token weighted: the unclipped tokens' ρÂ, the clipped ones' constant
  let perToken = ratio.mul(tensor(slope, shape, logprobs.dtype))
    .add(tensor(clippedValue, shape, logprobs.dtype));
  if (beta > 0) {
    // the reference at the completions' tokens; elsewhere the policy's own (d = 0: nothing to overflow)
    const ref = Float64Array.from({ length: local }, (_, q) => (batch.mask[from * t + q] ? batch.refLogprobs![from * t + q] : lp[q]));
    const d = tensor(ref, shape, logprobs.dtype).sub(logprobs);
    perToken = perToken.sub(d.exp().sub(d).sub(1).mul(beta));
  }
  const loss = perToken.mul(tensor(weight, shape, logprobs.dtype)).sum().neg();
  const count = Math.max(1, tokens);
  return { loss, stats: { clipped: clipped / count, kl: klSum / count, ratio: ratioSum / count, tokens } };
}
