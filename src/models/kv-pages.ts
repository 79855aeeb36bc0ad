import { InvalidArgumentError } from '../errors.ts';
import { type PagedTimeMajorKV, Tensor } from '../tensor/index.ts';

/** Positions a page of keys and values holds (vLLM's default block size). */
export const KV_PAGE_SIZE = 16;

/**
 * One layer's keys and values for a page of positions, time-major [pageSize, kvHeads, D] each. `refs` counts its holders
 * (sessions' caches, the prefix cache): a page held by more than one is never written (copy on write).
 */
export interface KVPage {
  readonly k: Float32Array;
  readonly v: Float32Array;
  refs: number;
}

/**
 * Where a host's or a server's paged KV caches take their pages: it counts the bytes of the pages alive (held by at least
 * one cache), which is what the budget charges; a page whose last holder lets go is freed.
 */
export class KVPagePool {
  private held = 0;
  private count = 0;

  constructor(readonly pageSize = KV_PAGE_SIZE) {
    if (!Number.isInteger(pageSize) || pageSize < 1) throw new InvalidArgumentError(`a KV page holds a whole number of positions ≥ 1, not ${pageSize}`);
  }

  /** Bytes of the pages alive. */
  get bytes(): number {
    return this.held;
  }

  /** Pages alive. */
  get pages(): number {
    return this.count;
  }

  /** A new page for `width` (kvHeads · D) values per position, held once. */
  take(width: number): KVPage {
    const n = this.pageSize * width;
    this.held += 8 * n;
    this.count++;
    return { k: new Float32Array(n), v: new Float32Array(n), refs: 1 };
  }

  retain(page: KVPage): KVPage {
    page.refs++;
    return page;
  }

  /** One holder lets go of the page; freed with its last. */
  release(page: KVPage): void {
    if (page.refs <= 0) throw new InvalidArgumentError('a KV page was released more often than held');
    if (--page.refs > 0) return;
    this.held -= 4 * (page.k.length + page.v.length);
    this.count--;
  }

  /** Bytes of the pages `positions` positions of `width` values take, per layer. */
  bytesFor(positions: number, width: number): number {
    return Math.ceil(positions / this.pageSize) * 8 * this.pageSize * width;
  }
}

/**
 * A layer's cache of one sequence in pages from a pool: it grows a page at a time, drops positions by letting go of
 * pages, and begins with pages another cache holds (a shared prefix) without copying them: a write into a page it
 * shares copies that page first. Unlike GrowingKV an entry is the cache itself (appending returns it, changed).
 */
export class PagedKV {
  private constructor(
    private readonly pool: KVPagePool,
    private readonly pages: KVPage[],
    readonly kvHeads: number,
    readonly dim: number,
    /** Positions held. */
    public length: number,
  ) {}

  /** An empty cache of `kvHeads` heads of `dim`. */
  static empty(pool: KVPagePool, kvHeads: number, dim: number): PagedKV {
    return new PagedKV(pool, [], kvHeads, dim, 0);
  }

  /** A cache that begins with these full pages (each held once more by it). */
  static sharing(pool: KVPagePool, pages: readonly KVPage[], kvHeads: number, dim: number): PagedKV {
    return new PagedKV(pool, pages.map((p) => pool.retain(p)), kvHeads, dim, pages.length * pool.pageSize);
  }

  readonly batch = 1;

  /** Appends k, v [1, kvHeads, t, D]. */
  append(k: Tensor, v: Tensor): this {
    const [b, h, t, d] = k.shape;
    if (k.ndim !== 4 || v.shape.join() !== k.shape.join() || k.dtype !== 'float32' || v.dtype !== 'float32' || b !== 1 || h !== this.kvHeads || d !== this.dim) {
      throw new InvalidArgumentError(`a paged cache of one sequence [1, ${this.kvHeads}, T, ${this.dim}] cannot append keys [${k.shape}] and values [${v.shape}]`);
    }
    const { pool, pages } = this;
    const size = pool.pageSize;
    const width = h * d;
    const ks = k.data as Float32Array;
    const vs = v.data as Float32Array;
    for (let ti = 0; ti < t; ti++) {
      const at = this.length + ti;
      const index = Math.floor(at / size);
      if (index === pages.length) pages.push(pool.take(width));
      else if (pages[index].refs > 1) pages[index] = this.copied(pages[index], at - index * size);
      const page = pages[index];
      const slot = (at - index * size) * width;
      for (let hi = 0; hi < h; hi++) {
        const from = (hi * t + ti) * d;
        page.k.set(ks.subarray(from, from + d), slot + hi * d);
        page.v.set(vs.subarray(from, from + d), slot + hi * d);
      }
    }
    this.length += t;
    return this;
  }

  /** A page of its own holding the first `positions` of a shared one (copy on write); the shared one is let go. */
  private copied(page: KVPage, positions: number): KVPage {
    const own = this.pool.take(this.kvHeads * this.dim);
    const n = positions * this.kvHeads * this.dim;
    own.k.set(page.k.subarray(0, n));
    own.v.set(page.v.subarray(0, n));
    this.pool.release(page);
    return own;
  }

  /** Keeps the first `length` positions: pages past them are let go. */
  truncate(length: number): void {
    if (!Number.isInteger(length) || length < 0 || length > this.length) throw new InvalidArgumentError(`cannot keep ${length} of ${this.length} cached positions`);
    const keep = Math.ceil(length / this.pool.pageSize);
    for (const page of this.pages.splice(keep)) this.pool.release(page);
    this.length = length;
  }

  /** Lets go of every page (the cache is empty after). */
  release(): void {
    this.truncate(0);
  }

  /** Its first `count` pages (full ones), to share. */
  fullPages(count: number): readonly KVPage[] {
    if (count * this.pool.pageSize > this.length) throw new InvalidArgumentError(`the cache holds ${this.length} positions, not ${count} full pages`);
    return this.pages.slice(0, count);
  }

  get timeMajor(): PagedTimeMajorKV {
    const { pages, length, kvHeads } = this;
    return { kPages: pages.map((p) => p.k), vPages: pages.map((p) => p.v), pageSize: this.pool.pageSize, length, kvHeads };
  }

  /** The keys, [1, kvHeads, T, D] (a copy). */
  get k(): Tensor {
    return this.headMajor('k');
  }

  /** The values, [1, kvHeads, T, D] (a copy). */
  get v(): Tensor {
    return this.headMajor('v');
  }

  private headMajor(which: 'k' | 'v'): Tensor {
    const { kvHeads: h, dim: d, length: t } = this;
    const size = this.pool.pageSize;
    const out = new Float32Array(h * t * d);
    for (let ti = 0; ti < t; ti++) {
      const page = this.pages[Math.floor(ti / size)][which];
      const slot = (ti % size) * h * d;
      for (let hi = 0; hi < h; hi++) out.set(page.subarray(slot + hi * d, slot + (hi + 1) * d), (hi * t + ti) * d);
    }
    return new Tensor(out, [1, h, t, d]);
  }
}
