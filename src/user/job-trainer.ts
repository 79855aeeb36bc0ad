import { VerificationError } from '../errors.ts';
import type { TrainingBatch } from '../models/index.ts';
import type { PipelineStage, PipelineStepResult, PipelineTrainer } from '../pipeline/index.ts';
import type { JobVerifier, VerificationSummary } from './verifier.ts';

/** A step's result with what verification did so far in the job. */
export interface JobStepResult extends PipelineStepResult {
  verification: VerificationSummary;
}

/**
 * The trainer of a distributed job: each step runs on the pipeline, then the validator
 * re-runs the records sampled during it. When a re-run fails, the worker is flagged (and so
 * excluded from every new plan), and the job is rolled back to its last verified state and
 * its steps replayed on workers still trusted.
 *
 * Under sampling, the last state whose every computation was checked is the job's start:
 * a worker caught at step t may have cheated unseen at any step before. So a rollback
 * re-plans the job on the trusted workers, reloads its sections from the user's source,
 * restores the user's ends, and replays every step since the start: the result is the one
 * an honest swarm gives (bit for bit on js), at the cost of the replayed steps.
 */
export class JobTrainer {
  private readonly batches: TrainingBatch[] = [];
  private resumed = false;
  /** A rollback that failed part way: the job is in no known state, and says so on every later step. */
  private broken: Error | null = null;

  constructor(
    private inner: PipelineTrainer,
    private readonly verifier: JobVerifier,
    /** Re-plans and reloads the job on trusted workers, restores the user's ends, and returns a fresh pipeline. */
    private readonly restart: () => Promise<PipelineTrainer>,
  ) {}

  get stepCount(): number {
    return this.inner.stepCount;
  }

  get lr(): number {
    return this.inner.lr;
  }

  get stages(): PipelineStage[] {
    return this.inner.stages;
  }

  get verification(): VerificationSummary {
    return this.verifier.summary;
  }

  /** Moves the learning-rate schedule to `step` (resuming a job: a rollback then cannot go back past the checkpoint). */
  fastForward(step: number): void {
    this.inner.fastForward(step);
    this.resumed = true;
  }

  async step(batch: TrainingBatch): Promise<JobStepResult> {
    if (this.broken) throw new VerificationError(`this job could not be rolled back and is in no known state: ${this.broken.message}`, { cause: this.broken });
    let result: PipelineStepResult;
    try {
      result = await this.inner.step(batch);
    } catch (err) {
      this.verifier.discardSampled();
      throw err;
    }
    this.batches.push(batch);
    let failed = await this.verifier.auditSampled();
    while (failed.length > 0) {
      if (this.resumed) {
        throw new VerificationError(`${failed.map((f) => f.peer).join(', ')} failed re-execution in a resumed job: resume again from the checkpoint without them`, {
          details: { flagged: failed.map((f) => f.peer) },
        });
      }
      try {
        this.inner = await this.restart();
        failed = [];
        for (const b of this.batches) {
          result = await this.inner.step(b);
          this.verifier.summary.replayedSteps++;
          failed = await this.verifier.auditSampled();
          if (failed.length > 0) break;
        }
      } catch (err) {
        this.verifier.discardSampled();
        this.broken = err as Error;
        throw err;
      }
    }
    return { ...result, verification: { ...this.verifier.summary, flagged: [...this.verifier.summary.flagged] } };
  }
}
