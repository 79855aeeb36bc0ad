/**
 * `rl(options)`: GRPO over a policy. Each step draws `prompts` prompts, has the policy sample `groupSize` completions
 * of each (rollouts), rewards them (the task's function), turns the rewards into group-relative advantages and takes
 * one optimizer step on GRPO's objective. With `overlap`, the rollouts of step n + 1 come from the policy before step
 * n's update, as INTELLECT-2 takes them (one step stale, their own log-probabilities π_old in the ratio): beside step n
 * when the policy draws them apart from what trains (`Policy.rollouts`: a second job of the adapter, given the factors
 * before each draw), else before step n trains. Held-out accuracy (greedy, exact match) every `evalEvery` steps.
 */
import { InvalidArgumentError } from '../errors.ts';
import { evaluateExactMatch, type GenerateOptions, type StepResult, type Tokenizer, type TrainingBatch } from '../models/index.ts';
import { Generator, type Tensor } from '../tensor/index.ts';
import { type AdvantageScale, GRPO_PRESETS, type GrpoOptions, type GrpoPreset, groupAdvantages } from './grpo.ts';
import { drawnKl, generateRollouts, grpoBatch, packRollouts, type Rollout, type RolloutGenerator } from './rollouts.ts';
import type { RlTask } from './tasks.ts';

/** What RL trains: it samples (rollouts), generates greedily (evaluation) and takes optimizer steps on a batch. */
export interface Policy extends RolloutGenerator {
  readonly tokenizer: Tokenizer;
  /** One optimizer step on `batch` (its objective GRPO's). */
  step(batch: TrainingBatch): Promise<StepResult>;
  /** Optimizer steps taken. */
  readonly version: number;
  /** Figures to show beside the next step (a job's dashboard: the rollouts' mean reward, held-out accuracy, their KL). */
  annotate?(figures: { reward?: number; accuracy?: number; kl?: number; rolloutTokensPerSecond?: number }): void;
  /** The reference policy's log-probabilities of `picked` [N, T] after `input` [N, T], flat (for a KL term, β > 0). */
  referenceLogprobs?(input: Tensor, picked: Tensor): Promise<Float32Array | Float64Array>;
  /**
   * Where rollouts are drawn, apart from what trains (a second job of the same adapter that does not train): they may
   * then run beside a step. `syncRollouts` puts the policy as it is now on it, and is called before each draw.
   */
  readonly rollouts?: RolloutGenerator;
  syncRollouts?(): Promise<void>;
}

export interface RlOptions {
  task: RlTask;
  policy: Policy;
  steps: number;
  /** Prompts a step (default 8). */
  prompts?: number;
  /** Completions of each prompt (G; default 8). */
  groupSize?: number;
  /** The objective's variant (default 'grpo'; 'dr-grpo', 'dapo'), and any setting over it. */
  preset?: GrpoPreset;
  grpo?: GrpoOptions & { scale?: AdvantageScale };
  /**
   * Draw step n + 1's rollouts from the policy before step n's update (off-policy by one step, importance-weighted by
   * their own log-probabilities; default false): beside step n where the policy draws rollouts apart (Policy.rollouts),
   * else before it.
   */
  overlap?: boolean;
  /** Held-out accuracy every this many steps, and after the last (default 10; 0: never). */
  evalEvery?: number;
  /** Held-out examples evaluated (default all of the task's). */
  evalSize?: number;
  seed?: number;
  /** The pad token's id in training batches (default 0: any id, its positions carry no loss). */
  padId?: number;
  onStep?: (stats: RlStepStats) => void;
}

export interface RlStepStats {
  step: number;
  /** Mean reward of the step's rollouts. */
  reward: number;
  /** Share of the rollouts whose reward was 1 (exact, for exact-answer tasks). */
  solved: number;
  loss: number;
  /** Share of the completions' tokens whose ratio was clipped. */
  clipped: number;
  /** Optimizer steps the rollouts were behind the policy they trained (0 on-policy, 1 overlapped). */
  stale: number;
  /** Tokens of the rollouts a second of their generation. */
  rolloutTokensPerSecond: number;
  seconds: number;
  /** Held-out exact match, on the steps evaluated. */
  accuracy?: number;
  /**
   * With a KL term: the rollouts' KL to the reference, k3 (e^d − d − 1, d = log π_ref − log π_old) averaged over their
   * tokens: of the policy that drew them, as drawn (the same figure in this process and across the swarm).
   */
  kl?: number;
}

export interface RlResult {
  steps: RlStepStats[];
  /** Held-out exact match before the first step and after the last (when evaluated). */
  accuracyBefore?: number;
  accuracyAfter?: number;
}

/** Held-out exact match of the policy, greedy. */
export async function heldOutAccuracy(policy: Policy, task: RlTask, size?: number): Promise<number> {
  const examples = size === undefined ? task.test : task.test.slice(0, size);
  const generator = { tokenizer: policy.tokenizer, generateBatch: (p: number[][], o: GenerateOptions) => policy.generateBatch(p, o) };
  const options = { terminator: task.terminator, maxNewTokens: task.maxNewTokens, batchSize: 250 };
  return (await evaluateExactMatch(generator, examples, options)).accuracy;
}

/** Runs GRPO (see the module's comment). */
export async function rl(options: RlOptions): Promise<RlResult> {
  const { task, policy } = options;
  const prompts = options.prompts ?? 8;
  const groupSize = options.groupSize ?? 8;
  // a task without held-out examples is judged by its reward alone
  const evalEvery = task.test.length === 0 ? 0 : options.evalEvery ?? 10;
  const seed = options.seed ?? 0;
  if (!Number.isInteger(options.steps) || options.steps < 1) throw new InvalidArgumentError(`steps must be a whole number ≥ 1, got ${options.steps}`);
  if (!Number.isInteger(prompts) || prompts < 1) throw new InvalidArgumentError(`prompts must be a whole number ≥ 1, got ${prompts}`);
  const { scale, ...preset } = { ...GRPO_PRESETS[options.preset ?? 'grpo'], ...options.grpo };
  const grpo: GrpoOptions = { ...preset, maxTokens: preset.maxTokens ?? task.maxNewTokens };
  const reference = policy.referenceLogprobs?.bind(policy);
  if ((grpo.beta ?? 0) > 0 && !reference) {
    throw new InvalidArgumentError('a KL term (beta > 0) needs the reference policy\'s log-probabilities, which this policy does not give: beta 0');
  }
  const rng = new Generator(seed);
  const draw = () => Array.from({ length: prompts }, () => task.prompts[rng.int(task.prompts.length)]);
  const drawFrom = policy.rollouts ?? policy;
  // the draw starts with the policy as it is when called: a step taken meanwhile does not reach it (drawn apart, synced before)
  const rollout = async (step: number) => {
    const started = performance.now();
    const version = policy.version;
    const made = await generateRollouts(drawFrom, policy.tokenizer, draw(), groupSize, {
      maxNewTokens: task.maxNewTokens, terminator: task.terminator, seed: seed * 1_000_003 + step * prompts * groupSize,
    });
    const seconds = (performance.now() - started) / 1000;
    const tokens = made.reduce((n, r) => n + r.completion.length, 0);
    return { rollouts: made, version, tokensPerSecond: tokens / Math.max(seconds, 1e-9) };
  };
  const result: RlResult = { steps: [] };
  if (evalEvery > 0) result.accuracyBefore = await heldOutAccuracy(policy, task, options.evalSize);
  const beside = options.overlap === true && policy.rollouts !== undefined;
  await policy.syncRollouts?.();
  let next: Promise<{ rollouts: Rollout[]; version: number; tokensPerSecond: number }> = rollout(1);
  for (let step = 1; step <= options.steps; step++) {
    const started = performance.now();
    const { rollouts, version, tokensPerSecond } = await next;
    const rewards = await Promise.all(rollouts.map((r) => task.reward(r.prompt, r.text)));
    const advantages = groupAdvantages(rewards, groupSize, scale);
    const packed = packRollouts(rollouts, options.padId ?? 0);
    const refLogprobs = (grpo.beta ?? 0) > 0 ? await reference!(packed.input, packed.picked) : undefined;
    const batch = grpoBatch(packed, advantages, { ...grpo, offPolicy: options.overlap === true, ...(refLogprobs ? { refLogprobs } : {}) });
    const kl = refLogprobs ? drawnKl(packed, refLogprobs) : undefined;
    // overlapped: the next step's rollouts are drawn from the policy as it is now, before this step's update; drawn
    // apart from what trains, beside the step, else before it
    if (options.overlap && step < options.steps) {
      if (beside) {
        await policy.syncRollouts?.();
        next = rollout(step + 1);
        // awaited next step; a step, an evaluation or a callback that throws first must not leave it unhandled
        next.catch(() => {});
      } else next = Promise.resolve(await rollout(step + 1));
    }
    const before = policy.version;
    const reward = rewards.reduce((a, b) => a + b, 0) / rewards.length;
    const accuracy = result.steps.findLast((s) => s.accuracy !== undefined)?.accuracy ?? result.accuracyBefore;
    policy.annotate?.({
      reward, rolloutTokensPerSecond: tokensPerSecond, ...(accuracy === undefined ? {} : { accuracy }), ...(kl === undefined ? {} : { kl }),
    });
    const trained = await policy.step(batch);
    const stats: RlStepStats = {
      step,
      reward,
      solved: rewards.filter((r) => r === 1).length / rewards.length,
      loss: trained.loss,
      clipped: batch.seen.clipped / Math.max(1, batch.seen.tokens),
      stale: before - version,
      rolloutTokensPerSecond: tokensPerSecond,
      seconds: (performance.now() - started) / 1000,
      ...(kl === undefined ? {} : { kl }),
    };
    if (evalEvery > 0 && (step % evalEvery === 0 || step === options.steps)) {
      stats.accuracy = await heldOutAccuracy(policy, task, options.evalSize);
    }
    result.steps.push(stats);
    options.onStep?.(stats);
    // on-policy: the next rollouts from the policy just stepped, after its evaluation (two sessions of one job at once
    // would share its checks, and a worker caught in one would re-plan the job under the other)
    if (!options.overlap && step < options.steps) {
      await policy.syncRollouts?.();
      next = rollout(step + 1);
    }
  }
  result.accuracyAfter = result.steps.at(-1)?.accuracy;
  return result;
}
