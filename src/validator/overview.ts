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
      const own = [...this.jobs.entries()].filter(([, j]) => j.owner === owner);
      if (own.length >= OVERVIEW_LIMITS.jobsPerPeer) {
        // the owner's closed jobs make room first; running ones it must close itself
        const closed = own.filter(([, j]) => j.state === 'closed').sort(([, a], [, b]) => a.updatedAt - b.updatedAt)[0];
        if (!closed) throw new RateLimitedError(`a peer may show ${OVERVIEW_LIMITS.jobsPerPeer} running jobs at once`);
        this.jobs.delete(closed[0]);
      }
      if (this.jobs.size >= OVERVIEW_LIMITS.jobs) this.dropOldest();
    }
    const history = seen?.history ?? [];
    const last = history.at(-1);
    if (!last || p.step !== last.step) {
      const point: JobPoint = { step: p.step, at: now, tokensPerSecond: p.tokensPerSecond };
      if (p.loss !== undefined) point.loss = p.loss;
      if (p.reward !== undefined) point.reward = p.reward;
      history.push(point);
      if (history.length > OVERVIEW_LIMITS.history) thin(history);
    }
    this.jobs.set(key, { ...p, owner, startedAt: seen?.startedAt ?? now, updatedAt: now, history });
  }

  /** The jobs on the board, the most recently heard first, as many as fit OVERVIEW_LIMITS.jobsBytes. */
  list(now = Date.now()): JobView[] {
    this.expire(now);
    const out: JobView[] = [];
    let bytes = 0;
    for (const j of [...this.jobs.values()].sort((a, b) => b.updatedAt - a.updatedAt)) {
      bytes += JSON.stringify(j).length;
      if (bytes > OVERVIEW_LIMITS.jobsBytes) break;
      out.push(j);
    }
    return out;
  }

  private expire(now: number): void {
    for (const [key, j] of this.jobs) {
      const ttl = j.state === 'closed' ? JOB_CLOSED_MS : JOB_SILENT_MS;
      if (now - j.updatedAt > ttl) this.jobs.delete(key);
    }
  }

  /** Makes room: the longest-closed job first, else the longest-silent one. */
  private dropOldest(): void {
    const byAge = [...this.jobs.entries()].sort(([, a], [, b]) => a.updatedAt - b.updatedAt);
    const oldest = byAge.find(([, j]) => j.state === 'closed') ?? byAge[0];
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

/** Of OVERVIEW_LIMITS.events, how many may be joins and leaves: peers coming and going (or made-up ones) must not push a failure off. */
export const MEMBERSHIP_EVENTS = 80;

/**
 * The recent verification and membership events, newest first, OVERVIEW_LIMITS.events at most,
 * in three rings: passed checks (PASSED_EVENTS), joins and leaves (MEMBERSHIP_EVENTS), and
 * failures and slashes (the rest), so that no flood of one kind pushes a caught cheater off.
 */
export class EventLog {
  private readonly rings = { passed: [] as OverviewEvent[], membership: [] as OverviewEvent[], alerts: [] as OverviewEvent[] };

  add(kind: OverviewEventKind, peer: string, detail: string, at = Date.now()): void {
    const which = kind === 'check-passed' ? 'passed' : kind === 'joined' || kind === 'left' ? 'membership' : 'alerts';
    const alerts = OVERVIEW_LIMITS.events - PASSED_EVENTS - MEMBERSHIP_EVENTS;
    const caps = { passed: PASSED_EVENTS, membership: MEMBERSHIP_EVENTS, alerts };
    const cap = caps[which];
    const ring = this.rings[which];
    ring.unshift({ at, kind, peer, detail: detail.slice(0, 512) });
    if (ring.length > cap) ring.length = cap;
  }

  list(): OverviewEvent[] {
    return [...this.rings.alerts, ...this.rings.membership, ...this.rings.passed].sort((a, b) => b.at - a.at);
  }
}
