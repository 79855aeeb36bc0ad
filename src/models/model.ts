import { InvalidArgumentError } from '../errors.ts';
import type { Module } from '../nn/index.ts';
import { Tensor, type TimeMajorKV } from '../tensor/index.ts';
import type { ModelConfig } from './config.ts';
import { type KVPage, type KVPagePool, PagedKV } from './kv-pages.ts';
import type { Tokenizer } from './tokenizer.ts';

/** A block's full pages of a shared prefix, and the shape of its keys. */
export interface SharedPages {
  readonly pages: readonly KVPage[];
  readonly kvHeads: number;
  readonly dim: number;
}

/** Keys and values of one attention layer for the tokens seen so far: [B, kvHeads, T, headDim]. */
export interface LayerCache {
  readonly k: Tensor;
  readonly v: Tensor;
  /**
   * A bounded cache (a device's decoding step, generation/device-step.ts): `k` and `v` hold a fixed
   * number of slots C, the keys mask says which are filled, and a step of one token writes its key
   * and value into the slot this one-hot float [1, 1, C, 1] marks instead of growing the cache, so
   * one traced step serves every position. Only while a trace records.
   */
  readonly slot?: Tensor;
}

/** Positions a layer's cache grows by at least, when it must grow. */
const KV_GROWTH_MIN = 32;

/** The buffers behind one or more GrowingKV entries: keys and values [B, capacity, kvHeads, D], positions [0, filled) written. */
interface KVStore {
  readonly k: Float32Array;
  readonly v: Float32Array;
  readonly capacity: number;
  filled: number;
}

/**
 * A layer's cache that grows in place: keys and values time-major in buffers with room to grow (by half again when
 * full, so a token's append costs its own keys, not the whole cache's), which attendTimeMajor reads where they lie.
 * An entry is immutable: appending returns a new entry over the same buffers while nothing has been written past it,
 * and copies into new buffers otherwise (two caches that share an entry each keep their own keys). `k` and `v`, as
 * [B, kvHeads, T, D], are copied out when first asked for (the attention paths that need them: masks, soft-caps).
 */
export class GrowingKV implements LayerCache {
  private kHeads: Tensor | null = null;
  private vHeads: Tensor | null = null;

  private constructor(
    private readonly store: KVStore,
    readonly batch: number,
    readonly kvHeads: number,
    readonly dim: number,
    /** Positions held. */
    readonly length: number,
  ) {}

  /** `entry` (a GrowingKV, any other LayerCache, or none) with k, v [B, kvHeads, t, D] appended. */
  static append(entry: LayerCache | null, k: Tensor, v: Tensor): GrowingKV {
    const [b, h, t, d] = k.shape;
    if (k.ndim !== 4 || v.shape.join() !== k.shape.join() || k.dtype !== 'float32' || v.dtype !== 'float32') {
      throw new InvalidArgumentError(`a cache appends float32 keys and values [batch, heads, time, head dim] alike, got [${k.shape}] and [${v.shape}]`);
    }
    if (entry === null) return new GrowingKV(newStore(b, h, d, t, 0), b, h, d, 0).write(k, v);
    const base = entry instanceof GrowingKV ? entry : GrowingKV.copyOf(entry);
    if (base.batch !== b || base.kvHeads !== h || base.dim !== d) {
      throw new InvalidArgumentError(`keys [${k.shape}] do not fit a cache of [${base.batch}, ${base.kvHeads}, ${base.length}, ${base.dim}]`);
    }
    return base.write(k, v);
  }

  /** A GrowingKV holding what a plain entry holds. */
  private static copyOf(entry: LayerCache): GrowingKV {
    const [b, h, t, d] = entry.k.shape;
    const store = newStore(b, h, d, t, 0);
    toTimeMajor(entry.k.data as Float32Array, store.k, b, h, t, d, store.capacity, 0);
    toTimeMajor(entry.v.data as Float32Array, store.v, b, h, t, d, store.capacity, 0);
    store.filled = t;
    return new GrowingKV(store, b, h, d, t);
  }

  /** This entry's positions and the new ones, in place when the store has room and nothing past this entry in it. */
  private write(k: Tensor, v: Tensor): GrowingKV {
    const t = k.shape[2];
    const { batch: b, kvHeads: h, dim: d, length } = this;
    let store = this.store;
    if (store.filled !== length || store.capacity < length + t) {
      store = newStore(b, h, d, length + t, Math.floor(store.capacity * 1.5));
      const old = this.store;
      const span = length * h * d;
      for (let bi = 0; bi < b; bi++) {
        store.k.set(old.k.subarray(bi * old.capacity * h * d, bi * old.capacity * h * d + span), bi * store.capacity * h * d);
        store.v.set(old.v.subarray(bi * old.capacity * h * d, bi * old.capacity * h * d + span), bi * store.capacity * h * d);
      }
    }
    toTimeMajor(k.data as Float32Array, store.k, b, h, t, d, store.capacity, length);
    toTimeMajor(v.data as Float32Array, store.v, b, h, t, d, store.capacity, length);
    store.filled = length + t;
    return new GrowingKV(store, b, h, d, length + t);
  }

  /**
   * The first `length` positions (a speculative pass's rejected positions dropped). The store is shared: the next append
   * writes in place over what was dropped, so an entry longer than `length` over the same store must not be used again
   * (a session's cache holds only its newest entry).
   */
  truncated(length: number): GrowingKV {
    if (!Number.isInteger(length) || length < 0 || length > this.length) throw new InvalidArgumentError(`cannot keep ${length} of ${this.length} cached positions`);
    if (this.store.filled === this.length) this.store.filled = length;
    return new GrowingKV(this.store, this.batch, this.kvHeads, this.dim, length);
  }

  /** The keys and values as attendTimeMajor reads them. */
  get timeMajor(): TimeMajorKV {
    const { k, v, capacity } = this.store;
    return { k, v, capacity, length: this.length, kvHeads: this.kvHeads };
  }

  /** The keys, [B, kvHeads, T, D]. */
  get k(): Tensor {
    return (this.kHeads ??= this.headMajor(this.store.k));
  }

  /** The values, [B, kvHeads, T, D]. */
  get v(): Tensor {
    return (this.vHeads ??= this.headMajor(this.store.v));
  }

  private headMajor(src: Float32Array): Tensor {
    const { batch: b, kvHeads: h, dim: d, length: t } = this;
    const cap = this.store.capacity;
    const out = new Float32Array(b * h * t * d);
    for (let bi = 0; bi < b; bi++) {
      for (let hi = 0; hi < h; hi++) {
        for (let ti = 0; ti < t; ti++) {
          const from = ((bi * cap + ti) * h + hi) * d;
          out.set(src.subarray(from, from + d), ((bi * h + hi) * t + ti) * d);
        }
      }
    }
    return new Tensor(out, [b, h, t, d]);
  }
}

/** Buffers for at least `needed` positions (and at least `wanted`), a multiple of KV_GROWTH_MIN. */
function newStore(b: number, h: number, d: number, needed: number, wanted: number): KVStore {
  const capacity = Math.ceil(Math.max(needed, wanted, 1) / KV_GROWTH_MIN) * KV_GROWTH_MIN;
  return { k: new Float32Array(b * capacity * h * d), v: new Float32Array(b * capacity * h * d), capacity, filled: 0 };
}

/** Writes x [B, H, T, D] into the time-major dst [B, capacity, H, D] at positions [at, at + T). */
function toTimeMajor(x: Float32Array, dst: Float32Array, b: number, h: number, t: number, d: number, capacity: number, at: number): void {
  for (let bi = 0; bi < b; bi++) {
    for (let hi = 0; hi < h; hi++) {
      for (let ti = 0; ti < t; ti++) {
        const from = ((bi * h + hi) * t + ti) * d;
        const to = ((bi * capacity + at + ti) * h + hi) * d;
        for (let i = 0; i < d; i++) dst[to + i] = x[from + i];
      }
    }
  }
}

/**
 * The KV cache of a decoding session: one entry per block, filled as tokens pass. A step
 * with the cache feeds only the new tokens; the prompt is never recomputed. Given a page pool
 * (one sequence only: hosts' sessions, a server's rows) its layers are paged (PagedKV) and may
 * begin with pages another cache holds (a shared prefix); otherwise each grows in place (GrowingKV).
 */
export class KVCache {
  readonly layers: (LayerCache | null)[];

  constructor(
    layers: number,
    readonly pool: KVPagePool | null = null,
  ) {
    this.layers = new Array<LayerCache | null>(layers).fill(null);
  }

  /** Tokens already cached (the same for every layer this cache holds; a section holds some). */
  get length(): number {
    for (const entry of this.layers) if (entry) return entryLength(entry);
    return 0;
  }

  /** Block `block`'s entry with k, v [B, kvHeads, T, D] appended (kept as its entry). */
  append(block: number, k: Tensor, v: Tensor): GrowingKV | PagedKV {
    const entry = this.layers[block];
    let next: GrowingKV | PagedKV;
    if (this.pool && !entry) next = PagedKV.empty(this.pool, k.shape[1], k.shape[3]).append(k, v);
    else if (entry instanceof PagedKV) next = entry.append(k, v);
    else next = GrowingKV.append(entry, k, v);
    this.layers[block] = next;
    return next;
  }

  /**
   * Begins an empty paged cache with shared full pages: for each block it holds, `pages` of keys and values of `kvHeads`
   * heads of `dim` (each page held once more by it); the cache then holds pages.length · pageSize positions of each.
   */
  share(blocks: ReadonlyMap<number, SharedPages>): void {
    const pool = this.pool;
    if (!pool || this.length > 0) throw new InvalidArgumentError('only an empty paged cache begins with shared pages');
    for (const [block, { pages, kvHeads, dim }] of blocks) this.layers[block] = PagedKV.sharing(pool, pages, kvHeads, dim);
  }

  /** Lets go of its pages (a paged cache: what it shared stays with the others); the cache is empty after. */
  release(): void {
    this.layers.forEach((entry, i) => {
      if (entry instanceof PagedKV) entry.release();
      this.layers[i] = null;
    });
  }

  /** Keeps the first `length` positions of every layer (a speculative pass's accepted ones): what it dropped is gone. */
  truncate(length: number): void {
    if (!Number.isInteger(length) || length < 0 || length > this.length) throw new InvalidArgumentError(`cannot keep ${length} of ${this.length} cached positions`);
    this.layers.forEach((entry, i) => {
      if (!entry) return;
      if (entry instanceof PagedKV) entry.truncate(length);
      else if (length === entryLength(entry)) return;
      else if (entry instanceof GrowingKV) this.layers[i] = entry.truncated(length);
      else if (entry.slot) throw new InvalidArgumentError('a bounded (device) cache cannot be truncated');
      else this.layers[i] = { k: entry.k.narrow(2, 0, length).contiguous(), v: entry.v.narrow(2, 0, length).contiguous() };
    });
  }
}

/** Positions a layer's cache entry holds (without copying its keys out). */
export function entryLength(entry: LayerCache): number {
  return entry instanceof GrowingKV || entry instanceof PagedKV ? entry.length : entry.k.shape[2];
}

/** What a layer needs besides its input: positions, which keys are real, the cache. */
export interface ForwardContext {
  /** Position of every token, int32 [B, T]. */
  positions: Tensor;
  /** Which keys (cached + new) may be attended to, int32 [B, Tk]; null when all may. */
  keyMask: Tensor | null;
  cache: KVCache | null;
}

export type LayerKind = 'embedding' | 'block' | 'norm' | 'head';

/** Sizes of one layer, per token where it says so: what the partitioner weighs. */
export interface LayerProfile {
  params: number;
  /** Bytes of its parameters at float32. */
  bytes: number;
  /** Forward FLOPs per token, excluding attention over the context. */
  flopsPerToken: number;
  /** Extra forward FLOPs per token per token of context (attention scores and weighted sum). */
  attentionFlopsPerContextToken: number;
  /** Bytes of its output activation per token at float32 (what crosses to the next stage). */
  activationBytesPerToken: number;
  /** Bytes of KV cache per token at float32. */
  kvBytesPerToken: number;
}

/** A layer's profile from its sizes, all at float32 (activation and KV sizes are widths per token). */
export function layerProfile(params: number, flopsPerToken: number, outWidth: number, attention = 0, kvWidth = 0): LayerProfile {
  return {
    params,
    bytes: 4 * params,
    flopsPerToken,
    attentionFlopsPerContextToken: attention,
    activationBytesPerToken: 4 * outWidth,
    kvBytesPerToken: 4 * kvWidth,
  };
}

/**
 * One named, cuttable layer of a model. Embeddings map int32 ids [B, T] to hidden states,
 * blocks and the final norm map [B, T, H] to [B, T, H], the head maps to logits [B, T, V].
 */
export interface ModelLayer {
  readonly name: string;
  readonly kind: LayerKind;
  /** Index among the blocks (for the cache), or -1. */
  readonly blockIndex: number;
  /** Its parameters under their Hugging Face names (a tied head lists the embedding it shares). */
  namedParameters(): [string, Tensor][];
  forward(x: Tensor, ctx: ForwardContext): Tensor;
  profile(): LayerProfile;
}

/**
 * The parameters of some layers under their checkpoint names; a tensor two layers share (a
 * tied head) is listed once, under the first name, and tensors in `exclude` not at all.
 */
export function layerParameters(layers: readonly ModelLayer[], exclude: ReadonlySet<Tensor> = new Set()): Map<string, Tensor> {
  const out = new Map<string, Tensor>();
  const seen = new Set<Tensor>(exclude);
  for (const layer of layers) {
    for (const [name, p] of layer.namedParameters()) {
      if (seen.has(p)) continue;
      seen.add(p);
      out.set(name, p);
    }
  }
  return out;
}

/** A causal language model: a Module whose forward is a fold over its layers. */
export interface CausalLM extends Module {
  readonly config: ModelConfig;
  /** The part of the model this object holds (the whole model unless built as a section or as the ends). */
  readonly section: ModelPart;
  /** The layers this object holds, in order: embedding, blocks, final norm, head (or those of its part). */
  readonly layers: readonly ModelLayer[];
  /**
   * Every layer of the whole model, held or not: names and profiles for planning. Only those
   * in `layers` can run.
   */
  readonly wholeLayers: readonly ModelLayer[];
  tokenizer: Tokenizer | null;
  /**
   * Runs this object's layers: logits [B, T, V] for ids [B, T] on a whole model; on a section,
   * whatever its first layer takes (ids or hidden states [B, T, H]) to what its last gives.
   */
  forward(input: Tensor, options?: ForwardOptions): Tensor;
  /** The tensors a Hugging Face checkpoint holds, under its names. */
  hfStateDict(): Map<string, Tensor>;
}

export interface ForwardOptions {
  cache?: KVCache | null;
  /** int32 [B, Tk]: 1 for real keys (cached + new), 0 for padding. */
  keyMask?: Tensor | null;
  /** int32 [B, T]; default: cache length + 0, 1, 2, ... */
  positions?: Tensor | null;
}

/**
 * A section of a model: layers [start, end) of its layer list, where 0 is the embedding,
 * 1..L the blocks, L + 1 the final norm and L + 2 the head. A worker builds only its section.
 */
export type SectionRange = [start: number, end: number];

/**
 * What a model object holds: a section (layers [start, end)), or 'ends', the user's part of a
 * model it keeps at home: the embedding, the final norm and the head, without the blocks.
 */
export type ModelPart = SectionRange | 'ends';

export interface SectionParts {
  embedding: boolean;
  /** Blocks [first, last) by block index. */
  blocks: [number, number];
  norm: boolean;
  head: boolean;
  /** The token table is needed by the embedding, and by a tied head. */
  tokenTable: boolean;
}

export function sectionParts(blocks: number, range: ModelPart | undefined, tied: boolean): SectionParts {
  const total = blocks + 3;
  if (range === 'ends') return { embedding: true, blocks: [0, 0], norm: true, head: true, tokenTable: true };
  const [start, end] = range ?? [0, total];
  if (!Number.isInteger(start) || !Number.isInteger(end) || start < 0 || end > total || start >= end) {
    throw new InvalidArgumentError(`section [${start}, ${end}) is not within the model's ${total} layers`);
  }
  const head = end === total;
  const embedding = start === 0;
  return {
    embedding,
    blocks: [Math.min(blocks, Math.max(0, start - 1)), Math.max(0, Math.min(blocks, end - 1))],
    norm: start <= blocks + 1 && end > blocks + 1,
    head,
    tokenTable: embedding || (head && tied),
  };
}

/** The layers of `whole` (every layer of a model) that `part` holds. */
export function partLayers(whole: readonly ModelLayer[], part: ModelPart): ModelLayer[] {
  return part === 'ends' ? whole.filter((l) => l.kind !== 'block') : whole.slice(part[0], part[1]);
}
