import { type CausalLM, canDecodeRows, decodeRows, type KVCache } from '../models/index.ts';
import type { WorkCounters } from '../p2p/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';

/** Rows a batch of decoding steps holds at most. */
export const MAX_BATCH_ROWS = 16;

/** One session's one-token step, waiting for its batch. */
interface Waiting {
  x: Tensor;
  cache: KVCache;
  positions: Tensor;
  done: (result: { out: Tensor; position: number } | Error) => void;
}

/**
 * Continuous batching of a section's decoding steps across sessions (different users' on a host): a step that arrives
 * waits for the end of the event loop's turn (the batch then running, and every request whose bytes came in the
 * meantime), and all steps waiting then run as one batch of up to MAX_BATCH_ROWS rows (decode-batch.ts: the weights
 * read once for all of them, each row with its own cache and position). A session's second step waits for the next
 * batch. One step alone runs as the section's own forward.
 */
export class DecodeBatcher {
  private waiting: Waiting[] = [];
  private scheduled = false;

  constructor(
    private readonly model: CausalLM,
    private readonly work: WorkCounters,
  ) {}

  /** The section's output for x [1, 1, hidden] at `positions` [1, 1], with the cache, and the cache's length before it. */
  step(x: Tensor, cache: KVCache, positions: Tensor): Promise<{ out: Tensor; position: number }> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ x, cache, positions, done: (r) => (r instanceof Error ? reject(r) : resolve(r)) });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.scheduled || this.waiting.length === 0) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.runBatch();
      this.schedule();
    });
  }

  private runBatch(): void {
    const batch: Waiting[] = [];
    const rest: Waiting[] = [];
    const caches = new Set<KVCache>();
    for (const w of this.waiting) {
      if (batch.length < MAX_BATCH_ROWS && !caches.has(w.cache)) {
        caches.add(w.cache);
        batch.push(w);
      } else rest.push(w);
    }
    this.waiting = rest;
    const positions = batch.map((w) => w.cache.length);
    if (batch.length > 1 && canDecodeRows(this.model, batch)) {
      let outs: Tensor[];
      try {
        outs = noGrad(() => decodeRows(this.model, batch));
      } catch (err) {
        for (const w of batch) w.done(asError(err));
        return;
      }
      this.work.batchedRows += batch.length;
      batch.forEach((w, i) => w.done({ out: outs[i], position: positions[i] }));
      return;
    }
    // one step, or steps that cannot be stacked: each its own forward, its own error
    batch.forEach((w, i) => {
      try {
        w.done({ out: noGrad(() => this.model.forward(w.x, { cache: w.cache, positions: w.positions })), position: positions[i] });
      } catch (err) {
        w.done(asError(err));
      }
    });
  }
}

function asError(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}
