import { InvalidArgumentError } from '../errors.ts';
import { AdamW, clipGradNorm, cosineWithWarmup, type LrLambda } from '../nn/index.ts';
import { crossEntropy, type Tensor, tensor } from '../tensor/index.ts';
import type { CausalLM } from './model.ts';

export interface LocalTrainerOptions {
  lr: number;
  /** Steps the schedule spans (warm-up then cosine down to 10%). */
  totalSteps: number;
  warmupSteps?: number;
  weightDecay?: number;
  /** Clip the global gradient norm to this (default 1; 0 disables). */
  clipNorm?: number;
  /**
   * Split each batch into this many micro-batches along the batch dimension and accumulate
   * their gradients (default 1). The loss is still the mean over the whole batch's targets.
   */
  microBatches?: number;
}

export interface StepResult {
  loss: number;
  gradNorm: number;
  lr: number;
  /** Tokens that carried loss. */
  tokens: number;
}

export interface TrainingBatch {
  input: Tensor;
  target: Tensor;
  /**
   * A loss other than the mean cross-entropy over the targets (reinforcement learning's: rl/grpo.ts): given the logits
   * of rows [start, end) of the batch (a micro-batch), their share of the batch's loss, the shares adding up to it.
   * The targets still say which positions carry loss (the tokens counted).
   */
  objective?: BatchObjective;
}

/** A batch's loss over the logits [rows, T, V] of its rows [start, end): see TrainingBatch.objective. */
export type BatchObjective = (logits: Tensor, rows: readonly [number, number]) => Tensor;

/** The learning-rate multiplier of TensorLink's trainers: linear warm-up, then cosine to 10%. */
export function trainingSchedule(options: { totalSteps: number; warmupSteps?: number }): LrLambda {
  const warmupSteps = options.warmupSteps ?? Math.min(100, Math.floor(options.totalSteps / 10));
  return cosineWithWarmup({ warmupSteps, totalSteps: options.totalSteps, minRatio: 0.1 });
}

/** AdamW with weight decay on matrices only (not on biases, norms' gains), as the usual recipes. */
export function trainingOptimizer(params: Tensor[], options: { lr: number; weightDecay?: number }): AdamW {
  const decay = params.filter((p) => p.ndim >= 2);
  const noDecay = params.filter((p) => p.ndim < 2);
  return new AdamW(
    [
      { params: decay, options: { weightDecay: options.weightDecay ?? 0.1 } },
      { params: noDecay, options: { weightDecay: 0 } },
    ],
    { lr: options.lr },
  );
}

/** Rows [start, end) of an int32 [B, T] tensor. */
function rows(t: Tensor, start: number, end: number): Tensor {
  const width = t.shape[1];
  return tensor((t.data as Int32Array).slice(start * width, end * width), [end - start, width], 'int32');
}

/**
 * Splits a batch into `m` micro-batches along the batch dimension, as even as possible
 * (the first ones one row larger), in order.
 */
export function splitBatch(batch: TrainingBatch, m: number): TrainingBatch[] {
  const b = batch.input.shape[0];
  if (!Number.isInteger(m) || m < 1 || m > b) throw new InvalidArgumentError(`cannot split a batch of ${b} rows into ${m} micro-batches`);
  const out: TrainingBatch[] = [];
  let start = 0;
  for (let k = 0; k < m; k++) {
    const size = Math.floor(b / m) + (k < b % m ? 1 : 0);
    const part: TrainingBatch = { input: rows(batch.input, start, start + size), target: rows(batch.target, start, start + size) };
    const objective = batch.objective;
    if (objective) {
      const at = [start, start + size] as const;
      // a micro-batch's rows are rows [0, size) of its own: the objective is asked about the whole batch's
      part.objective = (logits, [a, b]) => objective(logits, [at[0] + a, at[0] + b]);
    }
    out.push(part);
    start += size;
  }
  return out;
}

/** Targets that carry loss (not −100). */
export function countTargets(target: Tensor): number {
  let n = 0;
  for (const t of target.data) if (t !== -100) n++;
  return n;
}

/**
 * A micro-batch's share of the whole batch's mean cross-entropy: its sum over targets
 * divided by the whole batch's target count, so the shares add up to the batch's loss.
 * A micro-batch with its own objective (TrainingBatch.objective) takes that instead.
 */
export function microBatchLoss(logits: Tensor, target: Tensor, batchTargets: number, objective?: BatchObjective): Tensor {
  if (objective) return objective(logits, [0, logits.shape[0]]);
  return crossEntropy(logits, target, { divisor: batchTargets });
}

/**
 * Training on one machine: cross-entropy over the targets (−100 ignored), gradient
 * clipping, AdamW under a warm-up + cosine schedule; optionally accumulated over micro-batches.
 */
export class LocalTrainer {
  readonly optimizer: AdamW;
  readonly lambda: LrLambda;
  readonly baseLr: number;
  stepCount = 0;

  constructor(
    readonly model: CausalLM,
    private readonly options: LocalTrainerOptions,
  ) {
    this.optimizer = trainingOptimizer(model.trainableParameters(), options);
    this.baseLr = options.lr;
    this.lambda = trainingSchedule(options);
    this.optimizer.lr = this.baseLr * this.lambda(0);
  }

  step(batch: TrainingBatch): StepResult {
    this.model.train();
    const lr = this.optimizer.lr;
    const parts = splitBatch(batch, this.options.microBatches ?? 1);
    const tokens = countTargets(batch.target);
    let loss = 0;
    for (const part of parts) {
      const l = microBatchLoss(this.model.forward(part.input), part.target, tokens, part.objective);
      l.backward(undefined, { releaseActivations: true });
      loss += l.item();
    }
    const clip = this.options.clipNorm ?? 1;
    const gradNorm = clip > 0 ? clipGradNorm(this.model.parameters(), clip) : Number.NaN;
    this.optimizer.step();
    this.optimizer.releaseGrads();
    this.stepCount++;
    this.optimizer.lr = this.baseLr * this.lambda(this.stepCount);
    return { loss, gradNorm, lr, tokens };
  }

  /** Moves the schedule to `step` (after restoring optimizer state on resume). */
  fastForward(step: number): void {
    this.stepCount = step;
    this.optimizer.lr = this.baseLr * this.lambda(step);
  }
}
