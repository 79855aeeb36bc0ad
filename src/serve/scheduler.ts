import { RateLimitedError, VerificationError } from '../errors.ts';
import type { GenerateOptions, RowOptions } from '../models/index.ts';

/**
 * Runs one batch of prompts (a local model's generateBatch, or a distributed model's), through the adapter its rows
 * asked for (null: the base model; every row of a batch asks for the same).
 */
export type BatchRunner = (prompts: number[][], options: GenerateOptions, adapter: string | null) => Promise<{ tokens: number[][] }>;

/** One sequence a request asks for: its prompt, its settings, and where its tokens go. */
export interface Row {
  prompt: number[];
  /** The adapter it runs through (`model` 'ID:NAME' of its request); null or absent: the base model. */
  adapter?: string | null;
  options: RowOptions;
  /** Each token as it comes, with the logits it was picked from (the model's; valid during the call). */
  onToken(token: number, logits: Float32Array): void;
}

/** Rows one batch runs at most (the requests of a batch share its decoding steps). */
export const MAX_BATCH_ROWS = 8;
/** Requests waiting at most: beyond it a request is refused with 429, not queued for minutes. */
export const MAX_QUEUED = 64;
/**
 * After a batch of several rows, the next batch waits up to this long for as many more rows as
 * that batch had: clients served together come back together, a few milliseconds apart, and would
 * otherwise split into a batch of the first to return and a batch of the rest. It starts as soon
 * as they are there; a lone client (its last batch had one row) never waits.
 */
export const GATHER_MS = 20;
/** A multi-row batch counts as a sign of concurrent clients for this long after it ended. */
export const GATHER_WINDOW_MS = 1_000;

/** Refuses a request when `waiting` requests wait already (`limit` at most): counted, and a RateLimitedError. */
export function refuseOverLimit(waiting: number, limit: number, counts: { refused: number }): void {
  if (waiting < limit) return;
  counts.refused++;
  throw new RateLimitedError(`${waiting} requests are waiting for the model already; try again shortly`);
}

interface Waiting {
  rows: Row[];
  resolve: () => void;
  reject: (err: unknown) => void;
}

/**
 * Requests are served in the order they came, in batches: when the model is free, the oldest
 * waiting requests that fit together (at most MAX_BATCH_ROWS rows, their longest prompt and
 * longest completion within the context) decode as one batch, each row with its own settings
 * and generator, so a request's tokens do not depend on what it was batched with. A request
 * never waits behind more than MAX_QUEUED others; a row cancelled (its reader left) stops
 * taking steps, and a batch whose rows all left ends, freeing its sessions on the workers.
 */
export class Scheduler {
  private readonly queue: Waiting[] = [];
  private running = false;
  /** The last batch's rows and when it ended (the gathering heuristic's evidence of concurrent clients). */
  private last = { rows: 0, endedAt: 0, queued: 0 };
  /** Requests served, rows decoded and batches run, for metrics. */
  readonly counts = { requests: 0, rows: 0, batches: 0, refused: 0 };

  constructor(
    private readonly run: BatchRunner,
    private readonly maxPositions: number,
    private readonly limits = { rows: MAX_BATCH_ROWS, queued: MAX_QUEUED, gatherMs: GATHER_MS },
  ) {}

  private queuedRows(): number {
    return this.queue.reduce((n, w) => n + w.rows.length, 0);
  }

  /** Wakes a gathering pump when a request comes. */
  private wake: (() => void) | null = null;

  /**
   * Waits (up to gatherMs) until the last batch's rows have come back on top of those already
   * waiting, when that batch had several and ended lately: its clients are on their way back.
   */
  private async gather(): Promise<void> {
    if (this.limits.gatherMs <= 0 || this.last.rows <= 1 || Date.now() - this.last.endedAt > GATHER_WINDOW_MS) return;
    // the rows that waited when the batch ended came from other clients: the batch's own come on top
    const want = Math.min(this.last.queued + this.last.rows, this.limits.rows);
    const until = Date.now() + this.limits.gatherMs;
    while (this.queuedRows() < want && Date.now() < until) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, until - Date.now());
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wake = null;
    }
  }

  /** Requests waiting (not yet decoding). */
  get waiting(): number {
    return this.queue.length;
  }

  /** Resolves when every row of the request has ended. Throws RateLimitedError when too many wait. */
  submit(rows: Row[]): Promise<void> {
    refuseOverLimit(this.queue.length, this.limits.queued, this.counts);
    return new Promise<void>((resolve, reject) => {
      this.queue.push({ rows, resolve, reject });
      this.wake?.();
      void this.pump();
    });
  }

  private need(rows: readonly Row[]): { prompt: number; completion: number } {
    return {
      prompt: Math.max(0, ...rows.map((r) => r.prompt.length)),
      completion: Math.max(0, ...rows.map((r) => r.options.maxNewTokens ?? 0)),
    };
  }

  /** The oldest requests that fit in one batch (the first always does: the server checked its length). */
  private next(): Waiting[] {
    const batch: Waiting[] = [this.queue.shift()!];
    let rows = batch[0].rows.length;
    const adapter = batch[0].rows[0]?.adapter ?? null;
    while (this.queue.length > 0) {
      const candidate = this.queue[0];
      // a batch runs through one adapter: a request for another waits for the next batch (still in order)
      if ((candidate.rows[0]?.adapter ?? null) !== adapter) break;
      const all = [...batch.flatMap((w) => w.rows), ...candidate.rows];
      const need = this.need(all);
      if (rows + candidate.rows.length > this.limits.rows || need.prompt + need.completion > this.maxPositions) break;
      batch.push(this.queue.shift()!);
      rows += candidate.rows.length;
    }
    return batch;
  }

  private async pump(): Promise<void> {
    if (this.running) return;
    this.running = true;
    try {
      // requests submitted in the same turn of the event loop start together
      await null;
      while (this.queue.length > 0) {
        await this.gather();
        const batch = this.next();
        const rows = batch.flatMap((w) => w.rows);
        const streams = rows.map((r) => streamedOnce(r));
        this.counts.batches++;
        this.counts.requests += batch.length;
        this.counts.rows += rows.length;
        try {
          await this.run(rows.map((r) => r.prompt), {
            rows: rows.map((r) => r.options),
            // a generation run again (a worker caught) streams nothing twice, and ends where it differs from what was sent
            onToken: (token, i, logits, index) => streams[i](token, i, logits, index),
          }, rows[0]?.adapter ?? null);
          for (const w of batch) w.resolve();
        } catch (err) {
          for (const w of batch) w.reject(err);
        }
        this.last = { rows: rows.length, endedAt: Date.now(), queued: this.queuedRows() };
      }
    } finally {
      this.running = false;
    }
  }
}

/**
 * A row's onToken, each token streamed once. A generation run again from its start (a worker or host caught, its
 * result discarded: HostedModel, a job's sessions) calls again from index 0: the tokens already streamed are passed over where the
 * new run gives the same, and one that differs ends the row with a VerificationError (what the client was sent came
 * from the host caught, and cannot be taken back).
 */
export function streamedOnce(row: Pick<Row, 'onToken'>): (token: number, sequence: number, logits: Float32Array, index: number) => void {
  const sent: number[] = [];
  return (token, _sequence, logits, index) => {
    if (index < sent.length) {
      if (sent[index] === token) return;
      throw new VerificationError(`a host serving this request was caught cheating, and token ${index + 1} of the ${sent.length} streamed `
        + 'so far is not what the hosts left give: send the request again');
    }
    sent.push(token);
    row.onToken(token, logits);
  };
}
