import type { CausalLM } from '../models/index.ts';
import { heldBytes } from '../models/index.ts';

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
