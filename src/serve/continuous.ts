import { type CausalLM, decodeRows, KVCache, KVPagePool, PrefixCache, prefillShared, sampleToken } from '../models/index.ts';
import { Generator, noGrad, tensor } from '../tensor/index.ts';
import { MAX_QUEUED, refuseOverLimit, type Row } from './scheduler.ts';

/** Rows decoding at once at most: each holds a paged KV cache, beginning with the pages of a prefix it shares. */
export const MAX_LIVE_ROWS = 32;

/** What the server asks of whatever decodes its requests' rows. */
export interface RowScheduler {
  /** Resolves when every row of the request has ended; throws RateLimitedError when too many wait. */
  submit(rows: Row[]): Promise<void>;
  /** Requests waiting (not yet decoding). */
  readonly waiting: number;
  /** Requests served, rows decoded, decoding steps (or batches) run, requests refused: for metrics. */
  readonly counts: { requests: number; rows: number; batches: number; refused: number };
  /** The KV cache's pages (bytes alive, pages shared from prefixes, prompt positions found shared): none without pages. */
  readonly kv?: () => KVStats;
}

/** What a server's paged KV cache holds now. */
export interface KVStats {
  /** Bytes of the pages alive (the live rows' and the kept prefixes'). */
  bytes: number;
  pages: number;
  /** Prefix pages kept, and how many of them a live row holds. */
  prefixPages: number;
  sharedPages: number;
  /** Prompt positions found in a kept prefix (not computed), and those computed. */
  hits: number;
  misses: number;
}

interface Request {
  rows: Row[];
  open: number;
  resolve: () => void;
  reject: (err: unknown) => void;
}

/** A row decoding: its own KV cache, position and generator. */
interface Live {
  row: Row;
  request: Request;
  cache: KVCache;
  position: number;
  rng: Generator;
  tokens: number;
  last: number;
  stops: Set<number>;
}

/**
 * Continuous batching for a model in this process: a request's rows join the running batch at the next step (each
 * prompt prefilled on its own, into a paged KV cache of its own that begins with the pages of a prompt's prefix another
 * row computed: a system prompt is computed and held once) and leave it when they end, letting go of their pages;
 * every step decodes one token of every live row at once (decodeRows: each projection once over the rows stacked,
 * each row's attention over its own cache), so nobody waits for a batch to finish. A row's tokens are those of its
 * request alone (bit for bit on js: the stacked products never mix rows). At most `maxRows` rows decode at once; a
 * request waits while its rows do not fit, in the order requests came.
 */
export class ContinuousScheduler implements RowScheduler {
  readonly counts = { requests: 0, rows: 0, batches: 0, refused: 0 };
  private readonly queue: Request[] = [];
  private live: Live[] = [];
  private running = false;
  readonly pool = new KVPagePool();
  readonly prefix = new PrefixCache(this.pool);

  constructor(
    private readonly model: CausalLM,
    private readonly limits = { rows: MAX_LIVE_ROWS, queued: MAX_QUEUED },
  ) {}

  readonly kv = (): KVStats => {
    const { pages, shared } = this.prefix.size;
    return { bytes: this.pool.bytes, pages: this.pool.pages, prefixPages: pages, sharedPages: shared, ...this.prefix.counts };
  };

  get waiting(): number {
    return this.queue.length;
  }

  submit(rows: Row[]): Promise<void> {
    refuseOverLimit(this.queue.length, this.limits.queued, this.counts);
    return new Promise<void>((resolve, reject) => {
      this.queue.push({ rows, open: rows.length, resolve, reject });
      void this.pump();
    });
  }

  private async pump(): Promise<void> {
    if (this.running) return;
    this.running = true;
    try {
      // requests submitted in the same turn of the event loop start together
      await null;
      while (this.queue.length > 0 || this.live.length > 0) {
        // the oldest requests whose rows fit beside the live ones join (one always does when none is live)
        let joined = false;
        while (this.queue.length > 0 && (this.live.length === 0 || this.live.length + this.queue[0].rows.length <= this.limits.rows)) {
          const request = this.queue.shift()!;
          this.counts.requests++;
          this.counts.rows += request.rows.length;
          if (request.rows.length === 0) request.resolve();
          for (const row of request.rows) this.guard([request], () => this.join(row, request));
          joined = true;
        }
        // the joiners' first tokens go out before the step (their readers run on this thread too)
        if (joined) await new Promise((resolve) => setImmediate(resolve));
        if (this.live.length > 0) {
          const live = this.live;
          this.counts.batches++;
          let outs: ReturnType<typeof decodeRows> = [];
          this.guard(live.map((l) => l.request), () => {
            const rows = live.map((l) => ({
              x: tensor([l.last], [1, 1], 'int32'), cache: l.cache, positions: tensor([l.position], [1, 1], 'int32'),
            }));
            outs = noGrad(() => decodeRows(this.model, rows));
          });
          // a row's own sampling or reader failing ends its request alone
          outs.forEach((out, i) => live[i].request.open >= 0 && this.guard([live[i].request], () => {
            live[i].position++;
            this.pick(live[i], out.data as Float32Array);
          }));
        }
        // requests that came during the step join at the next one
        await new Promise((resolve) => setImmediate(resolve));
      }
    } finally {
      this.running = false;
    }
  }

  /** Runs `work`; a failure ends every row of `requests` with it (the others go on). */
  private guard(requests: Request[], work: () => void): void {
    try {
      work();
    } catch (err) {
      const failed = new Set(requests);
      for (const l of this.live) if (failed.has(l.request)) l.cache.release();
      this.live = this.live.filter((l) => !failed.has(l.request));
      for (const r of failed) {
        r.open = -1;
        r.reject(err);
      }
    }
  }

  /** A row's prompt, prefilled into a cache of its own; its first token. */
  private join(row: Row, request: Request): void {
    if (request.open < 0) return;
    const { model } = this;
    const cache = new KVCache(model.config.layers, this.pool);
    const n = row.prompt.length;
    let logits;
    try {
      logits = prefillShared(this.prefix, cache, tensor(row.prompt, [1, n], 'int32'), (x, positions) =>
        noGrad(() => model.forward(x, { cache, positions, keyMask: null })));
    } catch (err) {
      cache.release();
      throw err;
    }
    const eos = model.tokenizer?.eosTokenId ?? model.config.eosTokenId ?? null;
    const live: Live = {
      row, request, cache, position: n, rng: new Generator(row.options.seed ?? 0), tokens: 0, last: 0,
      stops: new Set(row.options.stopTokens ?? (eos === null ? [] : [eos])),
    };
    const v = logits.shape[2];
    this.live.push(live);
    const t = logits.shape[1];
    this.pick(live, logits.data.subarray((t - 1) * v, t * v) as Float32Array);
  }

  /** The row's next token from its logits; the row leaves once it ended. */
  private pick(l: Live, logits: Float32Array): void {
    const { options } = l.row;
    const limit = options.maxNewTokens ?? 32;
    let ended = options.cancelled?.() === true || l.tokens >= limit;
    if (!ended) {
      const token = sampleToken(options.mask ? options.mask(logits) : logits, options, l.rng);
      l.tokens++;
      l.last = token;
      l.row.onToken(token, logits);
      ended = l.stops.has(token) || l.tokens >= limit || l.position + 1 >= this.model.config.maxPositions;
    }
    if (!ended) return;
    l.cache.release();
    this.live = this.live.filter((x) => x !== l);
    if (--l.request.open === 0) l.request.resolve();
  }
}
