import type { RowScheduler } from './continuous.ts';
import { MAX_QUEUED, refuseOverLimit, type Row } from './scheduler.ts';

/** Rows decoding at once at most, each its own session on the hosts. */
export const MAX_SESSION_ROWS = 32;

interface Request {
  rows: Row[];
  open: number;
  failed: boolean;
  resolve: () => void;
  reject: (err: unknown) => void;
}

/**
 * Continuous batching for a hosted model: each row is its own session on the hosts (`decode`), started as soon as there
 * is room among the `rows` decoding, and gone when it ends; the hosts batch the one-token steps of the sessions that
 * wait at the same time (worker/decode-batcher.ts), so a request joins the running batch at the hosts' next step and
 * nobody waits for a batch to finish. A row that fails ends its own request (the others go on).
 */
export class SessionRows implements RowScheduler {
  readonly counts = { requests: 0, rows: 0, batches: 0, refused: 0 };
  private readonly queue: Request[] = [];
  private live = 0;

  constructor(
    private readonly decode: (row: Row) => Promise<void>,
    private readonly limits = { rows: MAX_SESSION_ROWS, queued: MAX_QUEUED },
  ) {}

  get waiting(): number {
    return this.queue.length;
  }

  submit(rows: Row[]): Promise<void> {
    refuseOverLimit(this.queue.length, this.limits.queued, this.counts);
    return new Promise<void>((resolve, reject) => {
      this.queue.push({ rows, open: rows.length, failed: false, resolve, reject });
      this.start();
    });
  }

  /** Starts the oldest requests whose rows fit beside the live ones (one always does when none is live). */
  private start(): void {
    while (this.queue.length > 0 && (this.live === 0 || this.live + this.queue[0].rows.length <= this.limits.rows)) {
      const request = this.queue.shift()!;
      this.counts.requests++;
      this.counts.rows += request.rows.length;
      if (request.rows.length === 0) request.resolve();
      for (const row of request.rows) {
        this.live++;
        this.counts.batches++;
        // a row of a request that failed stops at its next token
        const cancelled = () => request.failed || row.options.cancelled?.() === true;
        this.decode({ ...row, options: { ...row.options, cancelled } }).then(() => {
          if (--request.open === 0 && !request.failed) request.resolve();
        }, (err: unknown) => {
          if (!request.failed) request.reject(err);
          request.failed = true;
        }).finally(() => {
          this.live--;
          this.start();
        });
      }
    }
  }
}
