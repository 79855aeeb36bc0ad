import { MemoryBudgetError } from '../errors.ts';
import { KVPagePool, PrefixCache } from '../models/index.ts';
import type { Section } from './jobs.ts';
import type { MemoryBudget } from './memory.ts';

/**
 * A hosted span's paged KV caches: one pool for its sessions' pages, the prefixes they share, and what the budget has
 * been charged for them (the pool's bytes and the prefixes' kept outputs, brought up to date after each change).
 */
export interface SectionPages {
  readonly pool: KVPagePool;
  readonly prefix: PrefixCache;
  charged: number;
}

const pagesOfSection = new WeakMap<Section, SectionPages>();

/** The section's pages (made on first use). */
export function sectionPages(section: Section): SectionPages {
  let pages = pagesOfSection.get(section);
  if (!pages) {
    const pool = new KVPagePool();
    pagesOfSection.set(section, (pages = { pool, prefix: new PrefixCache(pool), charged: 0 }));
  }
  return pages;
}

/** The section's pages if it has any (a span that never paged has none). */
export function pagesIf(section: Section): SectionPages | undefined {
  return pagesOfSection.get(section);
}

/**
 * Charges the budget what the section's pages and kept prefixes hold now: counted as they are, never refused (the steps
 * that made them were admitted ahead).
 */
export function syncPages(pages: SectionPages, memory: MemoryBudget, jobId: string): void {
  const now = pages.pool.bytes + pages.prefix.outputBytes;
  if (now === pages.charged) return;
  memory.count(jobId, 'kv-cache', now - pages.charged);
  pages.charged = now;
}

/**
 * Charges `bytes` ahead of a step (what it may take at most); past the budget, the prefixes no session holds are let go
 * and it is tried again before the step is refused.
 */
export function admitPages(pages: SectionPages | undefined, memory: MemoryBudget, jobId: string, bytes: number, what: string): void {
  try {
    memory.add(jobId, 'kv-cache', bytes, what);
  } catch (err) {
    if (!(err instanceof MemoryBudgetError) || !pages || pages.prefix.evictIdle() === 0) throw err;
    syncPages(pages, memory, jobId);
    memory.add(jobId, 'kv-cache', bytes, what);
  }
}
