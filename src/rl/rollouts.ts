/**
 * Rollouts: G sampled completions of each prompt, generated as one batch (every prompt's G rows side by side), each
 * token with the log-probability it was drawn with (π_old: from the logits at the user's head as they arrive); and the
 * training batch GRPO steps on: each completion after its prompt, the completion's tokens the only targets.
 */
import { type BatchObjective, type GenerateOptions, logSumExp, type Tokenizer, type TrainingBatch } from '../models/index.ts';
import { InvalidArgumentError } from '../errors.ts';
import { type Tensor, tensor } from '../tensor/index.ts';
import { grpoLoss, type GrpoOptions, tokenLogprobs } from './grpo.ts';

/** What generates rollouts: a model in this process, or a job or hosted model across the swarm. */
export interface RolloutGenerator {
  generateBatch(prompts: number[][], options: GenerateOptions): Promise<{ tokens: number[][] }>;
}

export interface Rollout {
  /** Which prompt of the step it answers (its group). */
  group: number;
  prompt: string;
  promptIds: number[];
  /** The sampled tokens, the terminator (when reached) last. */
  completion: number[];
  /** log π_old of each completion token, as it was drawn (temperature 1: the model's own distribution). */
  logprobs: number[];
  /** The completion's text before its terminator. */
  text: string;
  /** Whether it ended with the terminator (not cut at maxNewTokens). */
  finished: boolean;
}

/**
 * `groupSize` completions of each prompt, sampled at temperature 1 (row r's draws seeded with seed + r: the same seed,
 * the same rollouts), in one batch.
 */
export async function generateRollouts(
  policy: RolloutGenerator, tokenizer: Tokenizer, prompts: readonly string[], groupSize: number,
  options: { maxNewTokens: number; terminator: string; seed: number },
): Promise<Rollout[]> {
  const stop = tokenizer.encode(options.terminator);
  const encoded = prompts.map((p) => tokenizer.encode(p));
  const empty = prompts.findIndex((_, i) => encoded[i].length === 0);
  if (empty >= 0) throw new InvalidArgumentError(`prompt ${JSON.stringify(prompts[empty])} has no tokens: a completion needs a prompt to follow`);
  const rows = prompts.flatMap((_, g) => Array.from({ length: groupSize }, () => g));
  const logprobs: number[][] = rows.map(() => []);
  const { tokens } = await policy.generateBatch(rows.map((g) => encoded[g]), {
    maxNewTokens: options.maxNewTokens,
    stopTokens: stop,
    rows: rows.map((_, r) => ({ temperature: 1, seed: options.seed + r })),
    // by place, not pushed: a generation run again (a worker caught, the first result discarded) writes over the first's
    onToken: (token, sequence, logits, index) => {
      logprobs[sequence][index] = logits[token] - logSumExp(logits);
    },
  });
  return tokens.map((completion, r) => {
    const cut = completion.indexOf(stop[0]);
    return {
      group: rows[r],
      prompt: prompts[rows[r]],
      promptIds: encoded[rows[r]],
      completion,
      logprobs: logprobs[r].slice(0, completion.length),
      text: tokenizer.decode(cut >= 0 ? completion.slice(0, cut) : completion),
      finished: cut >= 0,
    };
  });
}

/** Rollouts as rows of a batch: each prompt and completion (padded at the end), the completions' tokens its targets. */
export interface PackedRollouts {
  /** [N, width] int32: each row's tokens but its last. */
  input: Tensor;
  /** [N, width] int32: the completion's tokens where they are next, −100 elsewhere. */
  target: Tensor;
  /** [N, width] int32: the same with 0 for −100 (ids to read log-probabilities at; the mask drops them). */
  picked: Tensor;
  /** [N × width]: 1 at the completions' tokens. */
  mask: Float32Array;
  /** [N × width]: the log-probabilities the completions' tokens were drawn with. */
  drawn: Float64Array;
  width: number;
}

export function packRollouts(rollouts: readonly Rollout[], padId: number): PackedRollouts {
  const width = Math.max(...rollouts.map((r) => r.promptIds.length + r.completion.length)) - 1;
  const n = rollouts.length;
  const input = new Int32Array(n * width).fill(padId);
  const target = new Int32Array(n * width).fill(-100);
  const picked = new Int32Array(n * width);
  const mask = new Float32Array(n * width);
  const drawn = new Float64Array(n * width);
  rollouts.forEach((r, i) => {
    const seq = [...r.promptIds, ...r.completion];
    for (let j = 0; j < seq.length - 1; j++) input[i * width + j] = seq[j];
    for (let k = 0; k < r.completion.length; k++) {
      const p = i * width + r.promptIds.length - 1 + k;
      target[p] = r.completion[k];
      picked[p] = r.completion[k];
      mask[p] = 1;
      drawn[p] = r.logprobs[k];
    }
  });
  const shape = [n, width];
  return { input: tensor(input, shape, 'int32'), target: tensor(target, shape, 'int32'), picked: tensor(picked, shape, 'int32'), mask, drawn, width };
}

/**
 * The batch a GRPO step trains on (packRollouts' rows), its objective GRPO's over the rows' advantages. `offPolicy`:
 * the rollouts' own log-probabilities are π_old (rollouts of an earlier policy, importance-weighted); otherwise the
 * policy is taken as the one that drew them (ratios 1). `refLogprobs` [N × width]: the reference policy's, for β > 0.
 */
export function grpoBatch(
  packed: PackedRollouts, advantages: ArrayLike<number>,
  options: GrpoOptions & { offPolicy?: boolean; refLogprobs?: ArrayLike<number> } = {},
): TrainingBatch & { seen: { clipped: number; tokens: number } } {
  const { width, mask, picked } = packed;
  const { offPolicy, refLogprobs, ...grpo } = options;
  const batch = { mask, advantages, ...(offPolicy ? { oldLogprobs: packed.drawn } : {}), ...(refLogprobs ? { refLogprobs } : {}) };
  // what the objective saw, summed over the micro-batches it was asked about
  const seen = { clipped: 0, tokens: 0 };
  const objective: BatchObjective = (logits, [a, b]) => {
    const ids = tensor((picked.data as Int32Array).subarray(a * width, b * width), [b - a, width], 'int32');
    const { loss, stats } = grpoLoss(tokenLogprobs(logits, ids), batch, grpo, [a, b]);
    seen.clipped += stats.clipped * stats.tokens;
    seen.tokens += stats.tokens;
    return loss;
  };
  return { input: packed.input, target: packed.target, objective, seen };
}

/** The rollouts' KL to a reference, k3 (e^d − d − 1, d = log π_ref − log π_old) averaged over their tokens. */
export function drawnKl(packed: PackedRollouts, refLogprobs: ArrayLike<number>): number {
  let sum = 0;
  let tokens = 0;
  for (let p = 0; p < packed.mask.length; p++) {
    if (!packed.mask[p]) continue;
    const d = refLogprobs[p] - packed.drawn[p];
    sum += Math.exp(d) - d - 1;
    tokens++;
  }
  return sum / Math.max(1, tokens);
}
