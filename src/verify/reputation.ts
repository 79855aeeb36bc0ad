import { InvalidArgumentError } from '../errors.ts';

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
  /** Scored rounds (`Reputation.score`): how many, their values' moving average, and the leaky count of rounds below the floor. */
  rounds?: { count: number; average: number; below: number };
}

/** How soft scores (`Reputation.score`) turn into an exclusion. */
export interface ScoreRule {
  /** A round's value below this counts against the worker. */
  floor: number;
  /** Rounds below the floor, net of good rounds (each forgives one), that exclude it (default 2). */
  rounds?: number;
}

/** Records whose checks are remembered (the oldest forgotten first). */
const MAX_COUNTED = 100_000;

/**
 * Reputation kept by a validator: score ← (1 − α)·score + α·outcome for every check of a
 * worker's work (a re-execution, a comparison among redundant copies). One failed check
 * flags the worker: the js backend is bitwise reproducible and ort is compared within a
 * tolerance no honest run has crossed, so a failure is evidence, not noise.
 */
export class Reputation {
  private readonly peers = new Map<string, Standing>();
  /** The checks counted, by peer and the record checked: a replayed check counts once. */
  private readonly counted = new Set<string>();
  /** Told when a peer is first flagged (excluded), with why and the key of the check: a validator shares it with the others. */
  onFlag: ((peer: string, reason: string, key: string | undefined) => void) | null = null;

  constructor(
    readonly alpha = 0.1,
    readonly initial = 0.5,
  ) {}

  standing(peer: string): Standing {
    return this.peers.get(peer) ?? { score: this.initial, passed: 0, failed: 0, excluded: false };
  }

  /**
   * Adds the outcome of one check; with `key` (the content address of the record checked), only the first check of that
   * record counts: a request replayed to the validator moves no reputation twice.
   */
  check(peer: string, passed: boolean, reason?: string, key?: string): Standing {
    if (key !== undefined) {
      const k = `${peer} ${key}`;
      if (this.counted.has(k)) return this.standing(peer);
      this.counted.add(k);
      if (this.counted.size > MAX_COUNTED) this.counted.delete(this.counted.values().next().value as string);
    }
    const s = { ...this.standing(peer) };
    const was = s.excluded;
    s.score = (1 - this.alpha) * s.score + this.alpha * (passed ? 1 : 0);
    if (passed) s.passed++;
    else {
      s.failed++;
      s.excluded = true;
      s.reason ??= reason;
    }
    this.peers.set(peer, s);
    if (s.excluded && !was) this.onFlag?.(peer, reason ?? 'a check failed', key);
    return s;
  }

  /**
   * Adds one round's soft score (a contribution score, from noisy evidence: a held-out loss on
   * a small batch), unlike `check`'s exclude-on-one: the value goes into a moving average
   * (α, as the checks' score), a round below `floor` adds one to a leaky count and a round at
   * or above it takes one off (never below 0), and the worker is excluded only once the count
   * reaches `rounds` (default 2): one bad round never excludes, a steady cheater is out within
   * `rounds` rounds. A round below the floor also counts as a failed check in `score`.
   *
   * @example
   * const r = new Reputation();
   * r.score('12D3…', -3, { floor: 0 }); // below, not yet excluded
   * r.score('12D3…', -3, { floor: 0 }).excluded; // true
   */
  score(peer: string, value: number, rule: ScoreRule, reason?: string): Standing {
    const limit = rule.rounds ?? 2;
    if (!Number.isInteger(limit) || limit < 1) throw new InvalidArgumentError(`rounds must be an integer ≥ 1, got ${limit}`);
    if (Number.isNaN(value)) throw new InvalidArgumentError('a round\'s score is NaN');
    const s = { ...this.standing(peer) };
    const before = s.rounds ?? { count: 0, average: value, below: 0 };
    const bad = value < rule.floor;
    s.rounds = {
      count: before.count + 1,
      average: before.count === 0 ? value : (1 - this.alpha) * before.average + this.alpha * value,
      below: bad ? before.below + 1 : Math.max(0, before.below - 1),
    };
    s.score = (1 - this.alpha) * s.score + this.alpha * (bad ? 0 : 1);
    const flagged = s.rounds.below >= limit && !s.excluded;
    if (flagged) {
      s.excluded = true;
      s.reason ??= reason ?? `${s.rounds.below} rounds scored below ${rule.floor}`;
    }
    this.peers.set(peer, s);
    if (flagged) this.onFlag?.(peer, s.reason ?? 'scored out', undefined);
    return s;
  }

  excluded(peer: string): boolean {
    return this.peers.get(peer)?.excluded ?? false;
  }

  all(): Map<string, Standing> {
    return new Map(this.peers);
  }
}
