import type { Optimizer } from './optimizer.ts';

/** A learning-rate multiplier as a function of the step (0-based). */
export type LrLambda = (step: number) => number;

/**
 * Linear warm-up from 0 to 1 over `warmupSteps`, then a half cosine down to
 * `minRatio` at `totalSteps` (Hugging Face's get_cosine_schedule_with_warmup when
 * minRatio is 0).
 */
export function cosineWithWarmup(options: {
  warmupSteps: number;
  totalSteps: number;
  minRatio?: number;
}): LrLambda {
  const { warmupSteps, totalSteps } = options;
  const minRatio = options.minRatio ?? 0;
  return (step) => {
    if (step < warmupSteps) return step / Math.max(1, warmupSteps);
    const progress = (step - warmupSteps) / Math.max(1, totalSteps - warmupSteps);
    const cosine = Math.max(0, 0.5 * (1 + Math.cos(Math.PI * Math.min(1, progress))));
    return minRatio + (1 - minRatio) * cosine;
  };
}

/** Linear warm-up then constant. */
export function constantWithWarmup(warmupSteps: number): LrLambda {
  return (step) => (step < warmupSteps ? step / Math.max(1, warmupSteps) : 1);
}

/**
 * Sets the optimizer's lr to base·f(step) as PyTorch's LambdaLR: at construction
 * (step 0) and after every `step()`.
 */
export class LRScheduler {
  readonly baseLr: number;
  stepCount = 0;

  constructor(
    private readonly optimizer: Optimizer<{ lr: number }>,
    private readonly lambda: LrLambda,
  ) {
    this.baseLr = optimizer.lr;
    optimizer.lr = this.baseLr * lambda(0);
  }

  step(): void {
    this.stepCount++;
    this.optimizer.lr = this.baseLr * this.lambda(this.stepCount);
  }

  get lr(): number {
    return this.optimizer.lr;
  }
}
