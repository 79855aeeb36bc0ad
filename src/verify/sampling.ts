import { InvalidArgumentError } from '../errors.ts';
import { Generator } from '../tensor/index.ts';

/**
 * Sampled re-execution: each record a worker returns is re-run by a validator with
 * probability p, chosen by the user after the record arrived (a worker cannot know which of
 * its computations will be checked). A worker that cheats on every computation and signs n
 * records per step escapes one step with probability (1 − p)^n, so it is caught at step s
 * with probability (1 − q)^(s−1)·q where q = 1 − (1 − p)^n: a geometric law with mean 1/q.
 * At p = 0.05 and n = 9 (four micro-batches' forwards and backwards and a step), q ≈ 0.37:
 * caught at the first step 37% of the time, within 3 steps 75%, within 10 steps 99%.
 */
export class AuditSampler {
  private readonly rng: Generator;

  constructor(
    readonly rate: number,
    seed: number = Math.floor(Math.random() * 2 ** 31),
  ) {
    if (!(rate >= 0 && rate <= 1)) throw new InvalidArgumentError(`the verify rate must be within [0, 1], got ${rate}`);
    this.rng = new Generator(seed);
  }

  /** Whether to re-execute the next record (at `rate`, or the sampler's own). */
  pick(rate = this.rate): boolean {
    if (rate === 0) return false;
    return this.rng.uniform() < rate;
  }
}

/** The probability that at least one of a step's `perStep` records is checked at rate p. */
export function stepCatchProbability(rate: number, perStep: number): number {
  return 1 - (1 - rate) ** perStep;
}

/** The expected step at which a worker cheating on every computation is first caught. */
export function expectedStepsToCatch(rate: number, perStep: number): number {
  return 1 / stepCatchProbability(rate, perStep);
}

/** The number of steps within which such a worker is caught with probability `confidence`. */
export function stepsToCatch(rate: number, perStep: number, confidence: number): number {
  const q = stepCatchProbability(rate, perStep);
  if (q >= 1) return 1;
  return Math.ceil(Math.log(1 - confidence) / Math.log(1 - q));
}
