import type { CausalLM } from '../models/index.ts';
import { heldBytes } from '../models/index.ts';
import type { SessionPrefill } from '../verify/index.ts';

/** Bytes of reference sections a validator keeps by default: enough for a few hosted spans of a small model. */
export const SECTION_CACHE_BYTES = 2 * 2 ** 30;

/**
 * The sections a validator checks commitments with, by job and weights hash (and adapter): fetched from a worker once,
 * checked against the hash its records name, and kept, least recently used first out past `capacity` bytes. A chunk
 * check then moves no weights: only the session's inputs.
 * @example
 * const cache = new SectionCache(); cache.set(key, section); cache.get(key)
 */
export class SectionCache {
  private readonly held = new Map<string, { section: CausalLM; bytes: number }>();
  private bytes = 0;

  constructor(readonly capacity = SECTION_CACHE_BYTES) {}

  get(key: string): CausalLM | undefined {
    const hit = this.held.get(key);
    if (!hit) return undefined;
    this.held.delete(key);
    this.held.set(key, hit); // most recent last
    return hit.section;
  }

  set(key: string, section: CausalLM): void {
    const bytes = heldBytes(section);
    if (bytes > this.capacity) return; // larger than the whole cache: used once, not kept
    const old = this.held.get(key);
    if (old) this.bytes -= old.bytes;
    this.held.delete(key);
    this.held.set(key, { section, bytes });
    this.bytes += bytes;
    for (const [k, v] of this.held) {
      if (this.bytes <= this.capacity) break;
      this.held.delete(k);
      this.bytes -= v.bytes;
    }
  }

  /** Sections held now. */
  get size(): number {
    return this.held.size;
  }
}

/** Sessions a validator checks as they go at once, the bytes their prefills hold in all, and how long an idle one is kept. */
export const MAX_SESSION_PREFILLS = 32;
export const SESSION_PREFILL_BYTES = 2 * 2 ** 30;
export const SESSION_PREFILL_IDLE_MS = 5 * 60_000;

/**
 * The sessions a validator checks as they go (a hosted session's host checked at each sampled chunk): each one's
 * prefill so far (its KV cache, the open chunk's values), so that the next check prefills only the steps after. The
 * least recently used goes past MAX_SESSION_PREFILLS or SESSION_PREFILL_BYTES, and any idle for SESSION_PREFILL_IDLE_MS;
 * a session whose state is gone is checked from its first step again. Checks of one session run one at a time, in the
 * order they came.
 */
export class SessionPrefills {
  private readonly held = new Map<string, { prefill: SessionPrefill; at: number }>();
  private readonly queues = new Map<string, Promise<unknown>>();

  get(key: string, now = Date.now()): SessionPrefill | undefined {
    this.expire(now);
    const hit = this.held.get(key);
    if (!hit) return undefined;
    this.held.delete(key);
    this.held.set(key, { ...hit, at: now });
    return hit.prefill;
  }

  set(key: string, prefill: SessionPrefill, now = Date.now()): void {
    this.held.delete(key);
    this.held.set(key, { prefill, at: now });
    let bytes = [...this.held.values()].reduce((sum, v) => sum + v.prefill.bytes, 0);
    while (this.held.size > MAX_SESSION_PREFILLS || (bytes > SESSION_PREFILL_BYTES && this.held.size > 1)) {
      const [oldest, v] = this.held.entries().next().value!;
      this.held.delete(oldest);
      bytes -= v.prefill.bytes;
    }
  }

  delete(key: string): void {
    this.held.delete(key);
  }

  /** Runs `work` after every earlier check of the same session. */
  serial<T>(key: string, work: () => Promise<T>): Promise<T> {
    const run = (this.queues.get(key) ?? Promise.resolve()).then(work, work);
    const tail = run.catch(() => {});
    this.queues.set(key, tail);
    void tail.then(() => {
      if (this.queues.get(key) === tail) this.queues.delete(key);
    });
    return run;
  }

  private expire(now: number): void {
    for (const [k, v] of this.held) if (now - v.at > SESSION_PREFILL_IDLE_MS) this.held.delete(k);
  }

  /** Sessions held now. */
  get size(): number {
    return this.held.size;
  }
}
