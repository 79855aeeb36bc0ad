import type { Plan } from '../plan/index.ts';
import type { JobPlacement } from './placement.ts';
import type { JobRecovery } from './recovery.ts';

/**
 * A job asks whether a better plan exists (a worker joined, a link changed) at most this often,
 * between sessions or at a training job's copies: each survey probes the candidates' links, and
 * moving a job reloads its sections, so it is not worth doing for every token or step.
 */
export const REPLAN_CHECK_MS = 60_000;

/**
 * A better plan over a swarm in which no worker came or went and no link changed by 2× is taken
 * only when it predicts a step at least this much faster: measured again on a busy machine, the
 * same links read 20–40% differently, and each move reloads every section.
 */
export const UNCHANGED_GAIN = 0.5;

/** What a survey of the swarm proposes (see proposeReplan). */
export interface ReplanProposal {
  reason: string;
  /** Predicted seconds a step: the running plan under today's links, and the proposal. */
  current: number;
  proposed: number;
  /** A worker joined or left, or a link changed, since the plan was made. */
  changed: boolean;
}

/** A job planned again because the swarm changed, and why. */
export interface ReplanEvent {
  at: number;
  /** What changed and the predicted step times before and after. */
  reason: string;
  /** The training step it moved at (none for generation). */
  step?: number;
}

/** Proposes a better plan under the swarm as it is now (null: keep this one). */
export type ProposeReplan = (current: Plan, avoid: ReadonlySet<string>) => Promise<ReplanProposal | null>;

/** Whether a job should move to a better plan, asked at most every REPLAN_CHECK_MS, and the moves it made. */
export class Replanner {
  readonly replans: ReplanEvent[] = [];
  private lastCheck = Date.now();

  constructor(
    /** null: the job cannot ask. */
    private readonly propose: ProposeReplan | null,
    private readonly placement: JobPlacement,
    private readonly recovery: JobRecovery,
  ) {}

  /**
   * Why the job should move to a better plan now (the swarm changed enough: see proposeReplan),
   * or null; asked at most every REPLAN_CHECK_MS. A survey that fails keeps the plan.
   */
  async betterPlan(): Promise<string | null> {
    if (!this.propose || !this.placement.canReplan || Date.now() - this.lastCheck < REPLAN_CHECK_MS) return null;
    this.lastCheck = Date.now();
    try {
      const p = await this.propose(this.placement.plan, await this.recovery.recentlyLost());
      // the same swarm measured again reads differently on a loaded machine: a move needs a change, or a large gain
      if (!p || (!p.changed && p.proposed > (1 - UNCHANGED_GAIN) * p.current)) return null;
      return p.reason;
    } catch {
      return null;
    }
  }

  /** A move to a better plan was made (at training step `step`, if training). */
  moved(reason: string, step?: number): void {
    this.replans.push({ at: Date.now(), reason, ...(step === undefined ? {} : { step }) });
  }
}
