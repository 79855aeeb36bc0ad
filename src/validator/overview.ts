import {
  type JobPoint, type JobProgress, type JobView, OVERVIEW_LIMITS, type OverviewEvent, type OverviewEventKind,
} from '../p2p/index.ts';
import { RateLimitedError } from '../errors.ts';

/** A running job not heard from for this long has ended without saying so (its user died): it leaves the board. */
export const JOB_SILENT_MS = 120_000;
/** A job its user closed stays on the board this long, so people see how it ended. */
export const JOB_CLOSED_MS = 600_000;

/**
 * The jobs users report (`job-progress`), each under the peer that sent it, with the history a
 * dashboard plots. Bounded: OVERVIEW_LIMITS.jobs in all, jobsPerPeer for one user, history
 * points per job (the oldest half thinned when full, so a long run keeps its whole shape).
 */
export class JobBoard {
  private readonly jobs = new Map<string, JobView>();

  report(owner: string, p: JobProgress, now = Date.now()): void {
    this.expire(now);
    const key = `${owner}/${p.jobId}`;
    const seen = this.jobs.get(key);
    if (!seen) {
      const own = [...this.jobs.values()].filter((j) => j.owner === owner).length;
      if (own >= OVERVIEW_LIMITS.jobsPerPeer) throw new RateLimitedError(`a peer may show ${OVERVIEW_LIMITS.jobsPerPeer} jobs at once`);
      if (this.jobs.size >= OVERVIEW_LIMITS.jobs) this.dropOldest();
    }
    const history = seen?.history ?? [];
    const last = history.at(-1);
    if (!last || p.step !== last.step) {
      const point: JobPoint = { step: p.step, at: now, tokensPerSecond: p.tokensPerSecond };
      if (p.loss !== undefined) point.loss = p.loss;
      history.push(point);
      if (history.length > OVERVIEW_LIMITS.history) thin(history);
    }
    this.jobs.set(key, { ...p, owner, startedAt: seen?.startedAt ?? now, updatedAt: now, history });
  }

  /** The jobs on the board, the most recently heard first. */
  list(now = Date.now()): JobView[] {
    this.expire(now);
    return [...this.jobs.values()].sort((a, b) => b.updatedAt - a.updatedAt);
  }

  private expire(now: number): void {
    for (const [key, j] of this.jobs) {
      const ttl = j.state === 'closed' ? JOB_CLOSED_MS : JOB_SILENT_MS;
      if (now - j.updatedAt > ttl) this.jobs.delete(key);
    }
  }

  private dropOldest(): void {
    const oldest = [...this.jobs.entries()].sort(([, a], [, b]) => a.updatedAt - b.updatedAt)[0];
    if (oldest) this.jobs.delete(oldest[0]);
  }
}

/** Drops every other point of the older half: the plot keeps its shape at half the resolution where it matters least. */
function thin(history: JobPoint[]): void {
  const half = Math.floor(history.length / 2);
  const kept = history.slice(0, half).filter((_, i) => i % 2 === 0);
  history.splice(0, half, ...kept);
}

/** Of OVERVIEW_LIMITS.events, how many may be passed checks: a busy job passes several a second, and must not push a cheater off. */
export const PASSED_EVENTS = 40;

/**
 * The recent verification and membership events, newest first, OVERVIEW_LIMITS.events at most:
 * passed checks in a ring of their own (PASSED_EVENTS), so that failures, slashes, joins and
 * leaves stay on show however many checks pass.
 */
export class EventLog {
  private readonly notable: OverviewEvent[] = [];
  private readonly passed: OverviewEvent[] = [];

  add(kind: OverviewEventKind, peer: string, detail: string, at = Date.now()): void {
    const ring = kind === 'check-passed' ? this.passed : this.notable;
    const cap = kind === 'check-passed' ? PASSED_EVENTS : OVERVIEW_LIMITS.events - PASSED_EVENTS;
    ring.unshift({ at, kind, peer, detail: detail.slice(0, 512) });
    if (ring.length > cap) ring.length = cap;
  }

  list(): OverviewEvent[] {
    return [...this.notable, ...this.passed].sort((a, b) => b.at - a.at);
  }
}
