import { closedChunks, COMMIT_CHUNK, type WorkRecord } from '../verify/index.ts';

/**
 * The share of committed chunks checked by default (hosted sessions, and jobs' decoding): 0.37, the least that catches a
 * worker cheating on every chunk within 10 chunks with probability 99% (1 − 0.63¹⁰ > 0.99; stepsToCatch(0.37, 1, 0.99)
 * = 10). The validator prefills each worker's session once, as it goes (hosted) or at its end (jobs), so the cost is
 * about one prefill of the session's positions up to its last sampled chunk, per worker, whatever the share.
 */
export const DEFAULT_CHUNK_RATE = 0.37;

/** The sampled chunks of one host's (or worker's) part of a session, and what checking them needs. */
export interface ChunkChecks<H extends { peerId: string }> {
  hop: H;
  /** The host's records that carry the sampled chunks' commitments. */
  checks: WorkRecord[];
  chunks: number[];
  /** The last of those records, and the hashes of the steps its session was sent up to it. */
  last: WorkRecord;
  sent: string[];
}

/**
 * Samples the chunks hosts commit to (each chunk a record closes, independently, at `rate`) and gathers them per host
 * and session (`take`: a hosted session takes them after each record, a job when its session ends), and keeps the
 * steps no closed chunk covers yet (`takeTails`: a session's tail, re-run instead).
 * @example
 * const sampler = new ChunkSampler(0.37); sampler.offer(hop, record, sent, input); for (const c of sampler.take()) audit(c)
 */
export class ChunkSampler<H extends { peerId: string }> {
  private readonly pending = new Map<string, ChunkChecks<H>>();
  /** Per host and session: its steps since the last chunk it closed, which no commitment covers (yet). */
  private readonly uncovered = new Map<string, { hop: H; record: WorkRecord; sent: () => string[] }[]>();

  constructor(
    readonly rate: number,
    private readonly random: () => number = Math.random,
  ) {
    if (!(rate >= 0 && rate <= 1)) throw new RangeError(`a chunk sample rate must be within [0, 1], got ${rate}`);
  }

  /**
   * A record a host signed for a step of `input` ([rows, steps, …]): the chunks it closed are each sampled. `sent` (the
   * hashes of the session's steps up to this one) is called only when a chunk is picked.
   */
  offer(hop: H, record: WorkRecord, sent: () => string[], input: { shape: readonly number[] }): void {
    if (record.session === undefined) return;
    const steps = input.shape[1] ?? 1;
    const key = `${hop.peerId}/${record.job}/${record.session}`;
    // a step ending inside a chunk is covered only once that chunk closes: until then it is the session's tail
    const tail = this.uncovered.get(key) ?? [];
    if (record.commits !== undefined) tail.length = 0;
    if ((record.step + steps) % COMMIT_CHUNK !== 0) tail.push({ hop, record, sent });
    this.uncovered.set(key, tail);
    if (record.commits === undefined) return;
    const chunks = closedChunks(record.step, steps);
    const picked = chunks.filter(() => this.rate > 0 && (this.rate >= 1 || this.random() < this.rate));
    if (picked.length === 0) return;
    const open = this.pending.get(key);
    if (!open) {
      this.pending.set(key, { hop, checks: [record], chunks: picked, last: record, sent: sent() });
      return;
    }
    open.checks.push(record);
    open.chunks.push(...picked);
    if (record.step >= open.last.step) {
      open.last = record;
      open.sent = sent();
    }
  }

  /** The checks gathered so far, one per host and session; the sampler starts empty again. */
  take(): ChunkChecks<H>[] {
    const out = [...this.pending.values()];
    this.pending.clear();
    return out;
  }

  /**
   * The steps of each session that no closed chunk covers (its last positions after its last whole chunk, or all of a
   * session shorter than COMMIT_CHUNK), for re-running a share of them; they are forgotten here.
   */
  takeTails(): { hop: H; record: WorkRecord; sent: () => string[] }[] {
    const out = [...this.uncovered.values()].flat();
    this.uncovered.clear();
    return out;
  }
}
