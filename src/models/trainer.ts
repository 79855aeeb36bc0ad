import { AdamW, clipGradNorm, cosineWithWarmup, LRScheduler } from '../nn/index.ts';
import { crossEntropy, type Tensor } from '../tensor/index.ts';
import type { CausalLM } from './model.ts';

export interface LocalTrainerOptions {
  lr: number;
  /** Steps the schedule spans (warm-up then cosine down to 10%). */
  totalSteps: number;
  warmupSteps?: number;
  weightDecay?: number;
  /** Clip the global gradient norm to this (default 1; 0 disables). */
  clipNorm?: number;
}

export interface StepResult {
  loss: number;
  gradNorm: number;
  lr: number;
  /** Tokens that carried loss. */
  tokens: number;
}

/**
 * Training on one machine: cross-entropy over the targets (−100 ignored), gradient
 * clipping, AdamW under a warm-up + cosine schedule.
 */
export class LocalTrainer {
  readonly optimizer: AdamW;
  readonly scheduler: LRScheduler;
  stepCount = 0;

  constructor(
    readonly model: CausalLM,
    private readonly options: LocalTrainerOptions,
  ) {
    const decay: Tensor[] = [];
    const noDecay: Tensor[] = [];
    for (const [, p] of model.namedParameters()) (p.ndim >= 2 ? decay : noDecay).push(p);
    this.optimizer = new AdamW(
      [
        { params: decay, options: { weightDecay: options.weightDecay ?? 0.1 } },
        { params: noDecay, options: { weightDecay: 0 } },
      ],
      { lr: options.lr },
    );
    const warmupSteps = options.warmupSteps ?? Math.min(100, Math.floor(options.totalSteps / 10));
    this.scheduler = new LRScheduler(this.optimizer, cosineWithWarmup({ warmupSteps, totalSteps: options.totalSteps, minRatio: 0.1 }));
  }

  step(batch: { input: Tensor; target: Tensor }): StepResult {
    this.model.train();
    const lr = this.optimizer.lr;
    const loss = crossEntropy(this.model.forward(batch.input), batch.target);
    loss.backward(undefined, { releaseActivations: true });
    const clip = this.options.clipNorm ?? 1;
    const params = this.optimizer.params;
    const gradNorm = clip > 0 ? clipGradNorm(params, clip) : Number.NaN;
    this.optimizer.step();
    this.optimizer.releaseGrads();
    this.scheduler.step();
    this.stepCount++;
    let tokens = 0;
    for (const t of batch.target.data) if (t !== -100) tokens++;
    return { loss: loss.item(), gradNorm, lr, tokens };
  }

  /** Moves the schedule to `step` (after restoring optimizer state on resume). */
  fastForward(step: number): void {
    while (this.scheduler.stepCount < step) this.scheduler.step();
    this.stepCount = step;
  }
}
