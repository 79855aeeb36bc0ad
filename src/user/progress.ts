import type { Libp2p } from '@libp2p/interface';
import { type DialTarget, type JobProgress, request } from '../p2p/index.ts';

/** A report the validator has not answered within this is dropped: the dashboard is a view, never worth stalling a job for. */
export const PROGRESS_TIMEOUT_MS = 5_000;
/**
 * Reports go out at most this often (the newest waits its turn): a small model trains hundreds of
 * steps a second, and every control message counts against the user's rate at the validator.
 */
export const PROGRESS_INTERVAL_MS = 250;
/** How long closing a job waits for its last report to be answered. */
export const CLOSE_WAIT_MS = 1_000;

type Report = Omit<JobProgress, 'jobId' | 'stages' | 'model'>;

/** Reinforcement learning's figures (Policy.annotate): the rollouts' mean reward, held-out accuracy, KL, tokens a second. */
export interface Learning {
  reward?: number;
  accuracy?: number;
  kl?: number;
  rolloutTokensPerSecond?: number;
}

/**
 * Tells the validator how a job goes, for its dashboard: after each training step or generation
 * call. One report is in flight at a time; a newer one waiting replaces an older (so the last
 * state always arrives), and a failed one is dropped without touching the job.
 */
export class ProgressReporter {
  private inFlight: Promise<void> | null = null;
  private waiting: Report | null = null;
  private steps = 0;
  private tokens = 0;

  constructor(
    private readonly node: Libp2p,
    private readonly validator: DialTarget,
    private readonly job: () => { jobId: string; stages: JobProgress['stages'] },
    private readonly model?: string,
  ) {}

  /** Reinforcement learning's figures, shown with the training steps from now on (the job shows as 'rl'). */
  private learning: Learning | null = null;

  /**
   * The figures of reinforcement learning the next training step's report carries: its rollouts' mean reward, held-out
   * accuracy, their KL to the reference and their tokens a second.
   */
  annotate(figures: Learning): void {
    this.learning = { ...this.learning, ...figures };
  }

  /** A training step: its loss, tokens, wall time and each section's busy seconds (per copy). */
  trained(step: number, loss: number, tokens: number, seconds: number, busy: number[][]): void {
    this.tokens += tokens;
    const finite = (v: number | undefined) => v !== undefined && Number.isFinite(v);
    const rl = this.learning === null
      ? {}
      : {
          ...(finite(this.learning.reward) ? { reward: this.learning.reward } : {}),
          ...(finite(this.learning.accuracy) ? { accuracy: this.learning.accuracy } : {}),
          ...(finite(this.learning.kl) && this.learning.kl! >= 0 ? { kl: this.learning.kl } : {}),
          ...(finite(this.learning.rolloutTokensPerSecond) && this.learning.rolloutTokensPerSecond! >= 0
            ? { rolloutTokensPerSecond: this.learning.rolloutTokensPerSecond }
            : {}),
        };
    // a loss that diverged is left out (JSON has no NaN or Infinity): the job stays on show, without a loss
    this.send({
      kind: this.learning === null ? 'train' : 'rl', ...rl, state: 'running', step, ...(Number.isFinite(loss) ? { loss } : {}), tokens: this.tokens,
      tokensPerSecond: seconds > 0 ? tokens / seconds : 0, stageSeconds: busy.map((copies) => Math.max(0, ...copies)),
    });
  }

  /** A generation call answered: the tokens it made and how long it took. */
  generated(tokens: number, seconds: number): void {
    this.tokens += tokens;
    this.steps++;
    this.send({ kind: 'generate', state: 'running', step: this.steps, tokens: this.tokens, tokensPerSecond: seconds > 0 ? tokens / seconds : 0, stageSeconds: [] });
  }

  /** The job ended: the last report says so, at once (waited for CLOSE_WAIT_MS at most: a silent validator must not hold the close). */
  async closed(): Promise<void> {
    const last = this.waiting ?? this.last;
    if (!last) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const report = { ...last, state: 'closed' as const };
    if (this.inFlight) this.waiting = report;
    else this.send(report);
    const deadline = Date.now() + CLOSE_WAIT_MS;
    while (this.inFlight && Date.now() < deadline) {
      await Promise.race([this.inFlight, new Promise((r) => setTimeout(r, deadline - Date.now()).unref?.())]);
    }
  }

  private lastSent = 0;
  /** Set while a report waits for PROGRESS_INTERVAL_MS to pass. */
  private timer: ReturnType<typeof setTimeout> | null = null;

  private last: Report | null = null;

  /** The job id the last report went under: a job planned again (a rollback, a move) runs under a new one. */
  private shown: string | null = null;

  private send(report: Report): void {
    this.last = report;
    if (this.inFlight || this.timer) {
      this.waiting = report;
      return;
    }
    const wait = this.lastSent + PROGRESS_INTERVAL_MS - Date.now();
    if (wait > 0 && report.state !== 'closed') {
      this.waiting = report;
      this.timer = setTimeout(() => {
        this.timer = null;
        const next = this.waiting;
        this.waiting = null;
        if (next) this.send(next);
      }, wait);
      this.timer.unref?.();
      return;
    }
    this.lastSent = Date.now();
    const { jobId, stages } = this.job();
    if (this.shown !== null && this.shown !== jobId) {
      // the old id's last report: closed, so the dashboard does not show it running until it times out
      const old = { type: 'job-progress', jobId: this.shown, stages, ...(this.model ? { model: this.model } : {}), ...report, state: 'closed' };
      request(this.node, this.validator, old, PROGRESS_TIMEOUT_MS).catch(() => {});
    }
    this.shown = jobId;
    const message = { type: 'job-progress', jobId, stages, ...(this.model ? { model: this.model } : {}), ...report };
    this.inFlight = request(this.node, this.validator, message, PROGRESS_TIMEOUT_MS)
      .then(() => {}, () => {})
      .finally(() => {
        this.inFlight = null;
        const next = this.waiting;
        this.waiting = null;
        if (next) this.send(next);
      });
  }
}
