import { StageFailedError, VerificationError } from '../errors.ts';
import type { TrainingBatch } from '../models/index.ts';
import type { PipelineStage, PipelineStepResult, PipelineTrainer } from '../pipeline/index.ts';
import type { AuditVerdict, JobVerifier, VerificationSummary } from './verifier.ts';
import { isLoss, MAX_FAILOVERS } from './failover.ts';

/**
 * How a job survives a lost worker in training: every `every` steps it copies its state (every
 * section's weights and optimizer moments, and the user's ends) to the user (`take`); a step that
 * loses a worker has the job rebuilt from the last copy on live workers (`rebuild`: planned
 * again, sections loaded from the copy, moments restored, the learning-rate schedule moved to
 * the copy's step), and the steps since the copy are replayed, the interrupted one last. On js the
 * losses and weights are those of an undisturbed run, bit for bit.
 */
export interface TrainingFailover {
  /** Steps between copies (0: by time, `intervalMs`). */
  every: number;
  /** With `every` 0: the least time between copies (0: none; a failover then replays from the job's start). */
  intervalMs: number;
  take(step: number): Promise<void>;
  /** Right after a copy: why the job should move to a better plan (the swarm changed), or null to stay. */
  propose(): Promise<string | null>;
  /** A pipeline on the better plan, rebuilt from the copy just taken. */
  move(step: number, reason: string): Promise<PipelineTrainer>;
  /** A fresh pipeline at the copy's step (`from`), or the typed error that ends the job (no live worker can take a section). */
  rebuild(cause: unknown, attempt: number): Promise<{ pipeline: PipelineTrainer; from: number }>;
  /** The retried step is done: how long recovery took, and the steps replayed. */
  recovered(replayed: number): void;
}

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
  /** The step the job was resumed at (0: from its start): batches[i] is step base + i + 1. */
  private base = 0;
  /** Whether a copy of the job's state has been taken since it started or resumed. */
  private copied = false;
  /** When the last copy was taken (or the trainer made). */
  private lastCopy = Date.now();
  /** A rollback that failed part way: the job is in no known state, and says so on every later step. */
  private broken: Error | null = null;
  /**
   * The steps after which `sync` averaged the replicas' local steps outside the schedule (before an
   * evaluation or a checkpoint): a replay averages there too, or the replicas would go on from
   * weights the job never had.
   */
  private readonly synced = new Set<number>();
  /** The re-runs of the last step's sampled records, under way while the next step computes. */
  private pending: Promise<AuditVerdict[]> | null = null;

  constructor(
    private inner: PipelineTrainer,
    private readonly verifier: JobVerifier,
    /** Re-plans and reloads the job on trusted workers, restores the user's ends, and returns a fresh pipeline. */
    private readonly restart: () => Promise<PipelineTrainer>,
    /** Replaces lost workers (null: a lost worker fails the step). */
    private readonly failover: TrainingFailover | null = null,
  ) {
    this.watch(inner);
  }

  /** The pipeline settles the last step's re-runs before its flush: the workers keep what they need until then. */
  private watch(pipeline: PipelineTrainer): void {
    pipeline.beforeFlush = async () => {
      const failed = await this.takePending();
      if (failed.length > 0) throw new CaughtError(failed);
    };
  }

  private async takePending(): Promise<AuditVerdict[]> {
    const pending = this.pending;
    this.pending = null;
    return pending ? await pending : [];
  }

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
    this.base = step;
  }

  /**
   * One step. The records it sampled are re-run by the validator while the next step
   * computes, and settled before that step's flush (or by `settle`); a failure found then
   * rolls the job back and replays every step so far, this one included.
   */
  async step(batch: TrainingBatch): Promise<JobStepResult> {
    const result = await this.run(batch);
    this.onStep?.(result, batch.input.shape.reduce((a, b) => a * b, 1));
    return result;
  }

  /** Told after each step with its result and its tokens (the dashboard's progress). */
  onStep: ((result: JobStepResult, tokens: number) => void) | null = null;

  private async run(batch: TrainingBatch): Promise<JobStepResult> {
    if (this.broken) throw new VerificationError(`this job could not be rolled back and is in no known state: ${this.broken.message}`, { cause: this.broken });
    let result: PipelineStepResult;
    try {
      result = await this.inner.step(batch);
    } catch (err) {
      if (err instanceof CaughtError) {
        this.batches.push(batch);
        result = await this.rollback(err.failed);
        return this.answer(result);
      }
      this.verifier.discardSampled();
      const failed = await this.takePending().catch(() => []);
      if (!this.failover || !isLoss(err)) throw err;
      this.batches.push(batch);
      // the last step's checks found a cheater: its work is in every copy since the start, so the job goes back to its start
      if (failed.length > 0) return this.answer(await this.rollback(failed));
      result = await this.failOver(err);
      return this.answer(result);
    }
    this.batches.push(batch);
    this.pending = this.verifier.auditSampled();
    this.pending.catch(() => {}); // awaited before the next flush or by settle()
    return this.answer((await this.copy()) ?? result);
  }

  /**
   * Averages the replicas' local steps now (`syncEvery` > 1; nothing otherwise): a checkpoint
   * then holds their average. A worker lost meanwhile is replaced as outside a step (`heal`).
   */
  async sync(): Promise<void> {
    try {
      await this.inner.sync();
    } catch (err) {
      if (!this.failover || !isLoss(err)) throw err;
      await this.heal(err);
      // rebuilt from its last copy and replayed: the replicas average on the new workers
      await this.inner.sync();
    }
    this.synced.add(this.inner.stepCount);
  }

  /** One step replayed (a failover, a rollback): averaged after, as it was, if `sync` averaged after it. */
  private async replay(batch: TrainingBatch): Promise<PipelineStepResult> {
    const result = await this.inner.step(batch);
    if (this.synced.has(this.inner.stepCount)) await this.inner.sync();
    return result;
  }

  /**
   * A worker was lost outside a step (a generation or an evaluation beside the training): the job
   * is rebuilt from its last copy and the steps since are replayed, as for a step that lost one.
   */
  async heal(cause: unknown): Promise<void> {
    if (!this.failover) {
      throw new StageFailedError(`a worker of this job was lost, and its trainer runs without failover: ${(cause as Error).message}`, { cause });
    }
    this.verifier.discardSampled();
    const failed = await this.takePending().catch(() => []);
    if (failed.length > 0) await this.rollback(failed);
    else await this.failOver(cause);
  }

  /**
   * Copies the job's state to the user when a copy is due, and moves the job to a better plan if
   * the swarm changed. A step's result replayed meanwhile (a rollback) replaces the one given.
   */
  private async copy(): Promise<PipelineStepResult | null> {
    if (!this.failover) return null;
    const { every, intervalMs } = this.failover;
    // a resumed job takes its first copy at once: a failover before it would have nothing to go back to
    const first = this.resumed && !this.copied;
    const due = every > 0 ? this.inner.stepCount % every === 0 : intervalMs > 0 && Date.now() - this.lastCopy >= intervalMs;
    if (!(due || (first && (every > 0 || intervalMs > 0)))) return null;
    this.lastCopy = Date.now();
    const step = this.inner.stepCount;
    try {
      await this.failover!.take(step);
      this.copied = true;
    } catch (err) {
      // a worker lost while the copy was taken: the step is done, the last copy stays, and the next step fails over
      if (isLoss(err)) return null;
      throw err;
    }
    const reason = await this.failover!.propose();
    if (!reason) return null;
    // moving closes the job's sections, and with them what re-running the last step's records needs: settled first
    const failed = await this.takePending();
    if (failed.length > 0) return this.rollback(failed);
    try {
      const moved = await this.failover!.move(step, reason);
      this.inner = moved;
      this.watch(moved);
    } catch (err) {
      if (!isLoss(err)) {
        this.broken = err as Error;
        throw err;
      }
      // a worker lost while moving: rebuilt from the copy just taken, nothing to replay
      await this.failOver(err);
    }
    return null;
  }

  /**
   * A worker was lost in the step just tried: the job is rebuilt from its last copy on live
   * workers and the steps since are replayed, the interrupted one last; a worker lost during the
   * replay starts it over. Each replayed step's sampled records are re-run at once.
   */
  private async failOver(cause: unknown): Promise<PipelineStepResult> {
    let result: PipelineStepResult | null = null;
    if (this.resumed && !this.copied) {
      // its only earlier state is the checkpoint it resumed from, which the user holds, not the job
      throw new StageFailedError(`a worker was lost before a resumed job took its first copy: resume again from the checkpoint (${(cause as Error).message})`, { cause });
    }
    for (let attempt = 0; ; attempt++) {
      if (attempt >= MAX_FAILOVERS) {
        this.broken = cause as Error;
        throw new StageFailedError(`the job lost a worker ${attempt} times in a row while recovering: ${(cause as Error).message}`, { cause });
      }
      const { pipeline, from } = await this.failover!.rebuild(cause, attempt).catch((err: unknown) => {
        this.broken = err as Error;
        throw err;
      });
      this.inner = pipeline;
      this.inner.beforeFlush = null;
      try {
        for (const b of this.batches.slice(from - this.base)) {
          result = await this.replay(b);
          const failed = await this.verifier.auditSampled();
          if (failed.length > 0) return await this.rollback(failed);
        }
        this.failover!.recovered(this.batches.length - from);
        this.watch(this.inner);
        return result!;
      } catch (err) {
        this.verifier.discardSampled();
        if (err instanceof CaughtError) return await this.rollback(err.failed);
        if (!isLoss(err)) {
          this.broken = err as Error;
          throw err;
        }
        cause = err;
      }
    }
  }

  /**
   * Workers were caught outside a step, in a session of the job (a generation, its rollouts): their work may be in every
   * step so far, so the job is planned again on trusted workers and every step replayed, as for a step's failed re-run.
   */
  async caught(failed: AuditVerdict[]): Promise<void> {
    const pending = await this.takePending();
    await this.rollback([...failed, ...pending]);
  }

  /** Waits for the last step's re-runs; if one failed, rolls back and replays. What verification did, as of now. */
  async settle(): Promise<VerificationSummary> {
    const failed = await this.takePending();
    if (failed.length > 0) await this.rollback(failed);
    return this.verification;
  }

  private answer(result: PipelineStepResult): JobStepResult {
    return { ...result, verification: { ...this.verifier.summary, flagged: [...this.verifier.summary.flagged] } };
  }

  /** Plans the job again on trusted workers and replays every step so far, until a replay passes its checks. */
  private async rollback(failed: AuditVerdict[]): Promise<PipelineStepResult> {
    let result: PipelineStepResult | null = null;
    try {
      while (failed.length > 0) {
        if (this.resumed) {
          throw new VerificationError(`${failed.map((f) => f.peer).join(', ')} failed re-execution in a resumed job: resume again from the checkpoint without them`, {
            details: { flagged: failed.map((f) => f.peer) },
          });
        }
        this.verifier.discardSampled();
        this.inner = await this.restart();
        this.inner.beforeFlush = null; // a replay settles each step's checks at once
        failed = [];
        for (const b of this.batches) {
          try {
            result = await this.replay(b);
          } catch (err) {
            // a replica scored out during the replay (src/user/scoring.ts): planned again without it
            if (!(err instanceof CaughtError)) throw err;
            failed = err.failed;
            break;
          }
          this.verifier.summary.replayedSteps++;
          failed = await this.verifier.auditSampled();
          if (failed.length > 0) break;
        }
      }
    } catch (err) {
      this.verifier.discardSampled();
      this.broken = err as Error;
      throw err;
    }
    this.watch(this.inner);
    return result!;
  }
}

/**
 * Workers found out: by the last step's re-runs (the step under way stops before its flush), or
 * by the scores of their replicas' changes before an average (src/user/scoring.ts). The job is
 * rolled back and replayed without them.
 */
export class CaughtError extends Error {
  constructor(readonly failed: AuditVerdict[]) {
    super(`${failed.map((f) => `${f.peer} (${f.reason})`).join(', ')} found out`);
  }
}
