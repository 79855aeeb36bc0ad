/** The training loop: steps, periodic evaluation, checkpoints, a stop to resume from, over any Runner (runner.ts). */
import { InvalidArgumentError } from '../../errors.ts';
import { Generator } from '../../tensor/index.ts';
import type { Runner } from './runner.ts';
import type { Evaluation, TrainingSource } from './sources.ts';
import type { TrainerState } from './state.ts';

export interface TrainingOptions {
  runner: Runner;
  source: TrainingSource;
  /** Steps of the whole run. */
  steps: number;
  /** End after this step with a checkpoint, to go on later from it (default: `steps`). */
  stopAt?: number;
  /** Steps between evaluations, each followed by a checkpoint (and one at the last step). */
  evalEvery: number;
  /** The seed of the data's order (batches are drawn from Generator(seed + 1)). */
  seed: number;
  /** The learning rate, kept in the checkpoint. */
  lr: number;
  /** Where checkpoints go (none without). */
  out?: string;
  /** Where an earlier run stopped (readState of its checkpoint): its step, data order and losses go on from there. */
  resumeFrom?: TrainerState | null;
  /** After each step: its loss, learning rate and tokens, the run's tokens and seconds so far, the stages' busy seconds. */
  onStep?: (report: StepReport) => void;
  /** After each evaluation. */
  onEvaluation?: (report: { step: number; loss: number; evaluation: Evaluation; seconds: number }) => void;
  /**
   * After each step, evaluation and checkpoint, named ('step 3', 'step 3, evaluating', 'step 3, writing the checkpoint'):
   * where to report what the job did meanwhile (workers caught or lost).
   */
  onPhase?: (during: string) => void;
}

export interface StepReport {
  step: number;
  steps: number;
  loss: number;
  lr: number;
  /** Tokens of this run so far. */
  tokens: number;
  seconds: number;
  /** Each stage's replicas' busy seconds in this step (across workers). */
  busy?: number[][];
}

export interface TrainingResult {
  /** Every step's loss (of the earlier run too, when resumed). */
  losses: number[];
  /** The step it ended after. */
  steps: number;
  seconds: number;
  tokens: number;
  evals: ({ step: number } & Evaluation)[];
  /** Each stage's replicas' busy seconds in all (since the stages last changed). */
  busy: number[][];
}

/**
 * Trains: `steps` steps of the source's batches through the runner, an evaluation and a checkpoint every `evalEvery`
 * steps and at the end, a checkpoint at `stopAt`; resumed, it goes on where the checkpoint stopped, with the same data
 * order. Closes the runner when done.
 * @example
 * const result = await runTraining({ runner: localRunner(model, { source, steps: 100, lr: 1e-3, microBatches: 1, resumeFrom: null }),
 *   source, steps: 100, evalEvery: 20, seed: 0, lr: 1e-3, out: 'checkpoints' })
 * console.log(result.losses.at(-1), result.evals.at(-1))
 */
export async function runTraining(o: TrainingOptions): Promise<TrainingResult> {
  const { runner, source, steps, seed, lr } = o;
  const rng = new Generator(seed + 1);
  let losses: number[] = [];
  let start = 0;
  const stopAt = Math.min(steps, o.stopAt ?? steps);
  const evals: ({ step: number } & Evaluation)[] = [];
  const started = performance.now();
  let tokens = 0;
  let busy = runner.stageNames.map((names) => names.map(() => 0));
  try {
    if (o.resumeFrom) {
      if (o.resumeFrom.source !== source.name) throw new InvalidArgumentError(`the checkpoint was trained on ${o.resumeFrom.source}, not ${source.name}`);
      rng.setState(o.resumeFrom.rng);
      losses = o.resumeFrom.losses;
      start = o.resumeFrom.step;
    }
    const checkpoint = async (step: number) => {
      if (o.out) await runner.checkpoint(o.out, { step, totalSteps: steps, lr, seed, source: source.name, rng: rng.getState(), losses });
    };
    for (let step = start + 1; step <= stopAt; step++) {
      const r = await runner.step(source.batch(rng));
      o.onPhase?.(`step ${step}`);
      // a failover that planned the job again changed its stages: their busy times start over
      const reshaped = r.busy && (r.busy.length !== busy.length || r.busy.some((row, s) => row.length !== busy[s].length));
      if (r.busy && reshaped) busy = r.busy.map((row) => row.map(() => 0));
      losses.push(r.loss);
      tokens += r.tokens;
      r.busy?.forEach((row, s) => row.forEach((v, j) => (busy[s][j] += v)));
      const seconds = (performance.now() - started) / 1000;
      o.onStep?.({ step, steps, loss: r.loss, lr: r.lr, tokens, seconds, ...(r.busy ? { busy: r.busy } : {}) });
      if (step % o.evalEvery === 0 || step === steps) {
        const evaluation = await runner.evaluate();
        // a worker lost while evaluating or writing the checkpoint was replaced: said as for a step
        o.onPhase?.(`step ${step}, evaluating`);
        evals.push({ step, ...evaluation });
        o.onEvaluation?.({ step, loss: r.loss, evaluation, seconds });
        await checkpoint(step);
        o.onPhase?.(`step ${step}, writing the checkpoint`);
      } else if (step === stopAt) {
        await checkpoint(step);
        o.onPhase?.(`step ${step}, writing the checkpoint`);
      }
    }
  } finally {
    await runner.close();
  }
  return { losses, steps: stopAt, seconds: (performance.now() - started) / 1000, tokens, evals, busy };
}
