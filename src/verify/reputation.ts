/** A worker's standing with a validator: its score, its checks, and whether it is kept out of work. */
export interface Standing {
  /** An exponential moving average of its checks: 1 passed, 0 failed; a newcomer starts at `initial`. */
  score: number;
  passed: number;
  failed: number;
  /** Flagged: a check failed. Excluded from new plans and from running jobs. */
  excluded: boolean;
  /** Why it was flagged (the first failed check), for `status`. */
  reason?: string;
}

/**
 * Reputation kept by a validator: score ← (1 − α)·score + α·outcome for every check of a
 * worker's work (a re-execution, a comparison among redundant copies). One failed check
 * flags the worker: the js backend is bitwise reproducible and ort is compared within a
 * tolerance no honest run has crossed, so a failure is evidence, not noise.
 */
export class Reputation {
  private readonly peers = new Map<string, Standing>();

  constructor(
    readonly alpha = 0.1,
    readonly initial = 0.5,
  ) {}

  standing(peer: string): Standing {
    return this.peers.get(peer) ?? { score: this.initial, passed: 0, failed: 0, excluded: false };
  }

  /** Adds the outcome of one check. */
  check(peer: string, passed: boolean, reason?: string): Standing {
    const s = { ...this.standing(peer) };
    s.score = (1 - this.alpha) * s.score + this.alpha * (passed ? 1 : 0);
    if (passed) s.passed++;
    else {
      s.failed++;
      s.excluded = true;
      s.reason ??= reason;
    }
    this.peers.set(peer, s);
    return s;
  }

  excluded(peer: string): boolean {
    return this.peers.get(peer)?.excluded ?? false;
  }

  all(): Map<string, Standing> {
    return new Map(this.peers);
  }
}
