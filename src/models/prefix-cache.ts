import { createHash } from 'node:crypto';
import { InvalidArgumentError } from '../errors.ts';
import { cat, Tensor, tensor } from '../tensor/index.ts';
import { type KVPage, type KVPagePool, PagedKV } from './kv-pages.ts';
import type { KVCache, SharedPages } from './model.ts';

/** Bytes of prefix pages that no live cache holds, kept for the next sequence at most (the least recently used go first). */
export const PREFIX_IDLE_BYTES = 256 * 2 ** 20;

/** One full page of a prefix: its pages in each block, and (a section's) the output of its positions. */
interface PrefixPage {
  readonly blocks: ReadonlyMap<number, { page: KVPage; kvHeads: number; dim: number }>;
  readonly output: Float32Array | null;
  readonly depth: number;
  used: number;
}

/**
 * Shared prefixes of sessions that began with the same input (a system prompt, a chat's history): the full pages of
 * keys and values their first steps computed, each named by a hash that chains every input row from position 0 up to
 * its end, so a page is found only by a sequence that begins with all of its inputs, and what is found is what that
 * sequence would compute itself (attention is causal). A cache that begins with found pages holds them shared (copy on
 * write, kv-pages.ts) and computes only the rest. A section's pages keep the output rows of their positions as well, so
 * that its step still returns every position's output. Pages only this cache holds are let go least recently used
 * first, past `maxIdleBytes` of them or when asked to (`evictIdle`: a budget that needs the room).
 */
export class PrefixCache {
  private readonly pages = new Map<string, PrefixPage>();
  private tick = 0;
  /** Positions found shared, and positions looked for and not found: what `status` and the tests read. */
  readonly counts = { hits: 0, misses: 0 };

  constructor(
    readonly pool: KVPagePool,
    readonly maxIdleBytes = PREFIX_IDLE_BYTES,
  ) {}

  /** The names of the full pages of `rows` (T rows of `width` values from position 0: ids, or hidden states), chained. */
  keys(rows: Float32Array | Int32Array, width: number): string[] {
    const size = this.pool.pageSize;
    const bytes = new Uint8Array(rows.buffer, rows.byteOffset, rows.byteLength);
    const step = size * width * rows.BYTES_PER_ELEMENT;
    const out: string[] = [];
    let previous = rows instanceof Int32Array ? 'ids' : 'f32';
    for (let at = 0; at + step <= bytes.length; at += step) {
      previous = createHash('sha256').update(previous).update(bytes.subarray(at, at + step)).digest('hex');
      out.push(previous);
    }
    return out;
  }

  /** Full pages held for the first of `keys`, as many as follow one another from the start (at most `limit`). */
  lookup(keys: readonly string[], limit = keys.length): number {
    let n = 0;
    while (n < Math.min(limit, keys.length) && this.pages.has(keys[n])) n++;
    const tick = ++this.tick;
    for (let i = 0; i < n; i++) this.pages.get(keys[i])!.used = tick;
    this.counts.hits += n * this.pool.pageSize;
    this.counts.misses += (keys.length - n) * this.pool.pageSize;
    return n;
  }

  /** Begins the empty paged `cache` with the first `count` pages of `keys` (found by lookup). */
  attach(cache: KVCache, keys: readonly string[], count: number): void {
    if (count === 0) return;
    const blocks = new Map<number, SharedPages>();
    const found = keys.slice(0, count).map((key) => {
      const page = this.pages.get(key);
      if (!page) throw new InvalidArgumentError('a shared prefix page was let go before it was attached');
      return page;
    });
    for (const [block, { kvHeads, dim }] of found[0].blocks) {
      blocks.set(block, { pages: found.map((p) => p.blocks.get(block)!.page), kvHeads, dim });
    }
    cache.share(blocks);
  }

  /** The output rows [count · pageSize, width] of the first `count` pages of `keys` (a section's, as remembered). */
  outputs(keys: readonly string[], count: number): Float32Array {
    const rows = keys.slice(0, count).map((key) => this.pages.get(key)?.output);
    if (rows.some((r) => !r)) throw new InvalidArgumentError('a shared prefix page holds no outputs');
    const width = rows[0]?.length ?? 0;
    const out = new Float32Array(width * count);
    rows.forEach((r, i) => out.set(r!, i * width));
    return out;
  }

  /**
   * Keeps the full pages `from`..keys.length − 1 of `cache` (which holds at least those positions) under their keys; with
   * `output` (rows [≥ keys.length · pageSize, width] from position 0), their output rows too.
   */
  remember(keys: readonly string[], cache: KVCache, from: number, output: Float32Array | null = null, width = 0): void {
    const size = this.pool.pageSize;
    // the whole prefix is used at once: among its pages the deepest go first (a page is found only after the ones before)
    const tick = ++this.tick;
    for (const key of keys) {
      const page = this.pages.get(key);
      if (page) page.used = tick;
    }
    for (let i = from; i < keys.length; i++) {
      if (this.pages.has(keys[i])) continue;
      const blocks = new Map<number, { page: KVPage; kvHeads: number; dim: number }>();
      cache.layers.forEach((entry, block) => {
        if (!(entry instanceof PagedKV)) return;
        blocks.set(block, { page: this.pool.retain(entry.fullPages(i + 1)[i]), kvHeads: entry.kvHeads, dim: entry.dim });
      });
      if (blocks.size === 0) return;
      const rows = output ? output.slice(i * size * width, (i + 1) * size * width) : null;
      this.pages.set(keys[i], { blocks, output: rows, depth: i, used: tick });
    }
    this.trim(this.maxIdleBytes);
  }

  /** Bytes of the output rows it keeps (its pages are counted by their pool). */
  get outputBytes(): number {
    let n = 0;
    for (const p of this.pages.values()) n += 4 * (p.output?.length ?? 0);
    return n;
  }

  /** Lets go of every page only this cache holds (a budget that needs the room); the bytes freed. */
  evictIdle(): number {
    const before = this.pool.bytes;
    this.trim(0);
    return before - this.pool.bytes;
  }

  /** Prefix pages kept, and how many of them a live cache holds too. */
  get size(): { pages: number; shared: number } {
    let shared = 0;
    for (const p of this.pages.values()) if ([...p.blocks.values()].some((b) => b.page.refs > 1)) shared++;
    return { pages: this.pages.size, shared };
  }

  /** Lets go of idle pages, least recently used first (the deepest first among equals), until at most `keep` bytes of them remain. */
  private trim(keep: number): void {
    const bytes = (p: PrefixPage) =>
      4 * (p.output?.length ?? 0) + [...p.blocks.values()].reduce((n, b) => n + 4 * (b.page.k.length + b.page.v.length), 0);
    const idle = [...this.pages].filter(([, p]) => [...p.blocks.values()].every((b) => b.page.refs === 1));
    let held = idle.reduce((n, [, p]) => n + bytes(p), 0);
    if (held <= keep) return;
    idle.sort(([, a], [, b]) => a.used - b.used || b.depth - a.depth);
    for (const [key, page] of idle) {
      if (held <= keep) break;
      held -= bytes(page);
      this.pages.delete(key);
      for (const b of page.blocks.values()) this.pool.release(b.page);
    }
  }
}

/**
 * A sequence's first step (positions 0..T − 1, no mask) into the empty paged `cache`, beginning with the full pages
 * `prefix` holds for its input and computing only the rest (at least its last position): `run(x, positions)` runs the
 * model on the rest. Its full pages are kept for the next. `input` is ids [1, T] (a whole model: the result is the
 * rest's logits) or hidden states [1, T, H] (a section: the result is every position's output, the shared pages' as
 * kept). What a step computes for a position depends only on the inputs up to it, so the result is the step's own.
 */
export function prefillShared(prefix: PrefixCache, cache: KVCache, input: Tensor, run: (x: Tensor, positions: Tensor) => Tensor): Tensor {
  const [b, t] = input.shape;
  const ids = input.ndim === 2;
  if (b !== 1 || !cache.pool || cache.length > 0) throw new InvalidArgumentError('a shared prefix begins an empty paged cache of one sequence');
  const width = ids ? 1 : input.shape[2];
  const rows = input.contiguous().data;
  if (!(rows instanceof Float32Array || rows instanceof Int32Array)) throw new InvalidArgumentError(`a shared prefix is keyed by int32 ids or float32 rows, not ${input.dtype}`);
  const keys = prefix.keys(rows, width);
  const size = prefix.pool.pageSize;
  const found = prefix.lookup(keys, Math.floor((t - 1) / size));
  prefix.attach(cache, keys, found);
  const from = found * size;
  const positions = tensor(Array.from({ length: t - from }, (_, i) => from + i), [1, t - from], 'int32');
  const rest = run(found > 0 ? input.narrow(1, from, t - from).contiguous() : input, positions);
  let out = rest;
  if (!ids && found > 0) {
    const kept = prefix.outputs(keys, found);
    out = cat([new Tensor(kept, [1, from, rest.shape[2]]), rest], 1);
  }
  prefix.remember(keys, cache, found, ids ? null : (out.contiguous().data as Float32Array), ids ? 0 : out.shape[2]);
  return out;
}
