import type { Libp2p } from '@libp2p/interface';
import { PeerUnreachableError, StageFailedError, TensorLinkError } from '../errors.ts';
import { request } from '../p2p/index.ts';
import type { Plan } from '../plan/index.ts';
import type { JobStage } from './job-stage.ts';

/**
 * Failover: how a job tells a lost worker from a slow answer, and what it records when it
 * replaces one. Pure rules and one probe; the job's recovery (recovery.ts) does the replacing.
 */

/**
 * A request's deadline never goes below this: a step on a loaded machine (two cores shared by
 * several js workers in CI) takes seconds however small the model, and a deadline that fires
 * on a healthy worker costs a needless failover (the result is still right, the time is lost).
 */
export const DEADLINE_FLOOR_MS = 10_000;
/**
 * A worker may take this many times the plan's prediction before it is treated as lost. The
 * prediction comes from the worker's announced speed (a matrix-product benchmark): a real step
 * runs slower than that (small kernels, attention, the event loop), often several times, so the
 * slack is wide; a worker 20× slower than it announced is not the worker the plan was made for.
 */
export const DEADLINE_SLACK = 20;
/** A worker suspected lost must answer a control request within this, or it is lost. */
export const LIVENESS_TIMEOUT_MS = 5_000;
/** Attempts at a step that failed while every worker still answered, before the job gives up. */
export const STEP_RETRIES = 3;
/** Failovers in a row (each after another worker was lost on the way) before a job gives up. */
export const MAX_FAILOVERS = 8;
/** The first retry waits this long, each later one twice as long as the one before. */
export const RETRY_BASE_MS = 250;

/** The deadline of a request predicted to take `seconds`, never below `floorMs`. */
export function deadlineMs(seconds: number, floorMs = DEADLINE_FLOOR_MS): number {
  return Math.max(floorMs, Math.ceil(DEADLINE_SLACK * seconds * 1000));
}

/** The wait before retry `attempt` (0, 1, ...): exponential backoff. */
export function backoffMs(attempt: number): number {
  return RETRY_BASE_MS * 2 ** attempt;
}

/** The plan's predicted seconds for `tokens` tokens through every section, one after the other (a decoding step, or a forward). */
export function predictedSeconds(plan: Plan, tokens: number, planTokens: number): number {
  return plan.stages.reduce((sum, s) => sum + s.seconds, 0) * (tokens / Math.max(1, planTokens));
}

/**
 * Whether an error means a worker may be gone (its stream closed, a dial failed, no answer
 * before the deadline), as opposed to one that says what it computed is wrong or a request was
 * bad: the first is failed over, the second is not.
 */
export function isLoss(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    if (e instanceof PeerUnreachableError) return true;
    if (e instanceof TensorLinkError && e.name === 'PeerUnreachableError') return true;
    if (e instanceof TensorLinkError && e.name === 'StageFailedError') continue;
    if (e instanceof TensorLinkError) return false;
  }
  return false;
}

/** One worker replaced in a running job: what was lost, why, and how long the job took to go on. */
export interface FailoverEvent {
  /** 'generation' (a session's decoding steps) or 'training'. */
  during: 'generation' | 'training';
  /** The worker found lost, and the layers it held (global indices, end exclusive). */
  peer: string;
  layers: [number, number];
  /** What gave it away: the error the job saw. */
  cause: string;
  /** How the job went on: the section moved to a spare worker, or the whole job was planned again. */
  action: 'spare' | 'replanned';
  /** The workers that hold the lost layers now. */
  replacement: string[];
  /** Milliseconds since the epoch when the loss was detected. */
  detectedAt: number;
  /** Detection to the first result after it (a new token; the retried step done). */
  recoveredMs?: number;
  /** Decoding steps or training steps run again to rebuild what the lost worker held. */
  replayed: number;
}

/**
 * Runs `read` until it gives an answer: after a failure that means a worker may be lost, `recover`
 * replaces it (attempt 0, 1, ...) and `read` runs again on the job as it is then; any other
 * failure, or MAX_FAILOVERS in a row, is thrown. For what a job reads back between steps (its
 * weights, its optimizer state): the job it reads from after a failover holds the same values.
 */
export async function retryOnLoss<T>(read: () => Promise<T>, recover: (cause: unknown, attempt: number) => Promise<void>): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await read();
    } catch (err) {
      if (!isLoss(err)) throw err;
      if (attempt >= MAX_FAILOVERS) throw new StageFailedError(`a read from the job's workers failed ${attempt + 1} times in a row: ${(err as Error).message}`, { cause: err });
      await recover(err, attempt);
    }
  }
}

/** The peers a failure names as past their deadline (a request to them that timed out). */
export function latePeers(err: unknown): Set<string> {
  const out = new Set<string>();
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    const peer = (e as TensorLinkError).details?.peer;
    if (e.name === 'PeerUnreachableError' && typeof peer === 'string' && (e as TensorLinkError).details?.deadlineMs !== undefined) out.add(peer);
  }
  return out;
}

/** Where a session stood when its step failed: the stages that have not reached `position` did not finish the step. */
export interface SessionProgress {
  sessionId: string;
  position: number;
}

/**
 * Which of the job's stages are lost: one a request to which passed its deadline (`cause` names
 * it: alive perhaps, but far slower than it announced), one whose stream has closed, or whose
 * worker does not answer a control request within LIVENESS_TIMEOUT_MS (dead, cut off, or too
 * busy to answer). When all answer and a chained decoding step was late, the first stage of the
 * route that has not reached the step's end (`progress`) is the one holding it up.
 */
export async function findLost(
  node: Libp2p,
  stages: JobStage[],
  jobId: string,
  cause?: unknown,
  progress?: SessionProgress,
): Promise<JobStage[]> {
  const late = latePeers(cause);
  const verdicts = await Promise.all(stages.map(async (s) => {
    if (!s.remote.open || late.has(s.where.peerId)) return true;
    try {
      await request(node, { peerId: s.where.peerId, addrs: s.where.addrs }, { type: 'job-status', jobId }, LIVENESS_TIMEOUT_MS);
      return false;
    } catch {
      // no answer, or an error: a worker that restarted answers but no longer holds the job, and cannot serve it either
      return true;
    }
  }));
  const lost = stages.filter((_, i) => verdicts[i]);
  if (lost.length > 0 || !progress) return lost;
  for (const s of stages) {
    try {
      const answer = await s.remote.call({ type: 'session-status', sessionId: progress.sessionId }, [], LIVENESS_TIMEOUT_MS);
      const position = (answer.kind === 'control' ? (answer.message as { position?: unknown }).position : null);
      if (typeof position !== 'number' || position < progress.position) return [s];
    } catch {
      return [s];
    }
  }
  return [];
}

/** The typed error a user gets when no live worker can take a lost section. */
export function sectionLost(stage: JobStage, cause: unknown, why: string): StageFailedError {
  const { start, end, peerId } = stage.where;
  return new StageFailedError(`layers ${start}–${end - 1} were lost with worker ${peerId} (${(cause as Error).message}) and ${why}`, {
    cause, details: { layers: [start, end], peer: peerId },
  });
}
