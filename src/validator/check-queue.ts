import { RateLimitedError } from '../errors.ts';
import { Slots } from '../p2p/index.ts';

/** How many of a validator's checks (re-executions, disputes) may wait their turn, in all and per peer that asked. */
export interface CheckLimits {
  /** Run at once. */
  running: number;
  /** Waiting, in all: past it a request is refused (RateLimitedError), never queued without bound. */
  waiting: number;
  /** Running or waiting for one peer: one user cannot take every slot. */
  perPeer: number;
}

/** Verdicts kept for replays: a record already checked is answered from here, not run again. */
const KEPT_VERDICTS = 10_000;

/**
 * The validator's queue of checks: a few at a time, a bounded number waiting and per peer; the same check asked again
 * while it runs waits for that run, and asked after it ran (a replayed request: its signed records are the key) gets the
 * verdict it had, without running again (`keep` says which verdicts stand: a worker that could not be reached is asked
 * again next time).
 */
export class CheckQueue<T> {
  private readonly slots: Slots;
  private readonly inFlight = new Map<string, Promise<T>>();
  private readonly done = new Map<string, T>();
  // keys are hashes (the callers' sha256): what a peer sends cannot make them large
  private readonly byPeer = new Map<string, number>();
  private waiting = 0;
  /** Checks answered from a run already made (in flight or done). */
  replayed = 0;

  constructor(
    private readonly limits: CheckLimits,
    private readonly keep: (verdict: T) => boolean = () => true,
    private readonly what = 'checks',
  ) {
    this.slots = new Slots(limits.running);
  }

  /** The check's verdict, and whether it came from a run already made (the caller then logs and reports nothing new). */
  async run(from: string, key: string, task: () => Promise<T>): Promise<{ value: T; replayed: boolean }> {
    const kept = this.done.get(key) ?? this.inFlight.get(key);
    if (kept !== undefined) {
      this.replayed++;
      return { value: await kept, replayed: true };
    }
    const mine = this.byPeer.get(from) ?? 0;
    if (mine >= this.limits.perPeer) throw new RateLimitedError(`you have ${mine} ${this.what} waiting on this validator: wait for their answers`);
    if (this.waiting >= this.limits.waiting) throw new RateLimitedError(`this validator has ${this.waiting} ${this.what} waiting: try again later`);
    this.byPeer.set(from, mine + 1);
    this.waiting++;
    let started = false;
    const p = this.slots.run(() => {
      started = true;
      this.waiting--;
      return task();
    }).finally(() => {
      if (!started) this.waiting--;
      const n = (this.byPeer.get(from) ?? 1) - 1;
      if (n <= 0) this.byPeer.delete(from);
      else this.byPeer.set(from, n);
      this.inFlight.delete(key);
    });
    this.inFlight.set(key, p);
    const verdict = await p;
    if (this.keep(verdict)) {
      this.done.set(key, verdict);
      if (this.done.size > KEPT_VERDICTS) this.done.delete(this.done.keys().next().value as string);
    }
    return { value: verdict, replayed: false };
  }
}
