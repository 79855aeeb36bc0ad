import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError, PeerUnreachableError, VerificationError } from '../errors.ts';
import { type DialTarget, type PeerTarget, request, TRAIN_REQUEST_TIMEOUT_MS, type WireAdapter } from '../p2p/index.ts';
import { LedgerSubmitter } from './ledger-submitter.ts';
import { AuditSampler, type WorkRecord } from '../verify/index.ts';
import { Generator } from '../tensor/index.ts';
import { ChunkSampler, DEFAULT_CHUNK_RATE } from './hosted-checks.ts';

/** How a job checks its workers. */
export interface VerifyOptions {
  /**
   * Security level k: every section runs on k workers that compute the same micro-batches;
   * their results are compared before the user accepts one (bit for bit on js). Default 1.
   */
  redundancy?: number;
  /** The share of records a validator re-executes (default DEFAULT_SAMPLE_RATE; 0: none). */
  sampleRate?: number;
  /**
   * The share of the chunks of 32 positions that decoding steps commit to which the validator checks by one prefill
   * of the worker's section (activation commitments; default DEFAULT_CHUNK_RATE, 0.37, or 0 when sampleRate is 0). A
   * decoding step that closes a chunk is checked this way; the others are re-executed at sampleRate.
   */
  chunkRate?: number;
  /** Seeds which records are sampled (default: random; workers cannot predict it either way). */
  seed?: number;
  /**
   * Trust earned: until a worker has passed `checks` re-runs in this job, its records are
   * sampled at `rate` at least (default: off). Catches a cheater within its first steps; each
   * re-run moves the section's weights to the validator, so keep it for small models.
   */
  newcomer?: { rate: number; checks: number };
}

/** Audits a user has in flight at its validator at once (each a control stream and a re-execution there). */
export const AUDIT_CONCURRENCY = 4;

/**
 * The demo's trust rule (`VerifyOptions.newcomer`): a worker that has not yet passed
 * NEWCOMER_CHECKS re-runs has its records sampled at NEWCOMER_RATE at least, so a cheater is
 * caught within its first steps while honest workers soon drop to the job's own rate (a
 * cheater on every computation with 4 checkable records a step escapes a step at 0.2 with
 * probability 0.8⁴ ≈ 0.41).
 */
export const NEWCOMER_CHECKS = 8;
export const NEWCOMER_RATE = 0.2;

/** The sample rate when none is given: about one record in twenty re-run. */
export const DEFAULT_SAMPLE_RATE = 0.05;

/** What verification did in a job, as `--json` reports it. */
export interface VerificationSummary {
  /** Records re-executed by the validator (sampled, or settling a disagreement). */
  checked: number;
  failed: number;
  /** Workers caught: excluded from the job and flagged at the validator. */
  flagged: string[];
  /**
   * Workers this job left for computing with LoRA factors other than the ones it gave them (setAdapter): the user's
   * word against theirs, so not flagged at the validator.
   */
  left: string[];
  /** Steps run again after a rollback. */
  replayedSteps: number;
  /** Results compared among redundant workers. */
  compared: number;
  /** Records handed to the validator's ledger (those of workers still trusted once their step's checks were done). */
  recorded: number;
  /** Sampled records left unchecked because the validator could not be reached (it restarts; the job goes on without it). */
  unchecked: number;
  /** The records seen, by the backend they say computed them ('js', 'ort', 'webgpu'). */
  byBackend: Record<string, number>;
  /** Disagreements between redundant copies settled by a dispute (bisection to one op) rather than re-running both. */
  disputes: number;
  /** Chunks of decoding sessions checked against their activation commitments. */
  chunks: number;
}

export interface AuditVerdict {
  ok: boolean;
  reason: string;
  peer: string;
  /** It computed with LoRA factors other than the ones this job gave it: left, on the user's word (not flagged). */
  unproven?: boolean;
}

/**
 * The user's side of verification: samples the records its workers return, asks the
 * validator to re-run the sampled ones (the validator fetches what re-running needs from the
 * worker, re-executes and scores it), and settles disagreements among redundant workers the
 * same way. Counts what it did.
 */
export class JobVerifier {
  readonly redundancy: number;
  readonly sampler: AuditSampler;
  private sampled: { worker: PeerTarget; record: WorkRecord; sent?: string[] }[] = [];
  readonly summary: VerificationSummary = {
    checked: 0, failed: 0, flagged: [], left: [], replayedSteps: 0, compared: 0, recorded: 0, unchecked: 0, byBackend: {}, disputes: 0,
    chunks: 0,
  };

  /** Records returned since the last checks, handed to the ledger once those are done. */
  private observed: { worker: PeerTarget; record: WorkRecord }[] = [];
  /** Where accepted records go: the validator's ledger. */
  private readonly ledger: LedgerSubmitter;
  /** Workers this job no longer trusts: flagged by the validator, or that did not hand over what they signed. */
  readonly excluded = new Set<string>();
  /** Decoding sessions' chunks sampled for commitment checks. */
  private readonly chunks: ChunkSampler<PeerTarget>;
  private readonly newcomer: { rate: number; checks: number } | undefined;
  /** Re-runs each worker has passed in this job. */
  private readonly passed = new Map<string, number>();

  constructor(
    private readonly node: Libp2p,
    private readonly validator: DialTarget,
    /** The validators' peer ids: workers hand them what re-running their records needs. */
    readonly validatorPeers: readonly string[],
    options: VerifyOptions,
    /** What an audit request names: the job, the model's config and the optimizer's settings. */
    private readonly context: () => {
      jobId: string; config: Record<string, unknown>; optimizer: { lr: number; weightDecay?: number }; adapter?: WireAdapter;
      /** A job over a hosted model: that model (name, hash, the format the job holds it in), its frozen base. */
      base?: { name: string; hash: string; format: string };
      /** A job that does not train, given an adapter's factors: their hash for a section of these layers (factorsHash). */
      factorsOf?: (range: readonly [number, number]) => string | undefined;
    },
  ) {
    const k = options.redundancy ?? 1;
    if (!Number.isInteger(k) || k < 1) throw new InvalidArgumentError(`redundancy must be an integer ≥ 1, got ${k}`);
    this.redundancy = k;
    this.sampler = new AuditSampler(options.sampleRate ?? DEFAULT_SAMPLE_RATE, options.seed);
    const rng = new Generator(options.seed ?? Math.floor(Math.random() * 2 ** 31));
    const chunkRate = options.chunkRate ?? (this.sampler.rate === 0 ? 0 : DEFAULT_CHUNK_RATE);
    this.chunks = new ChunkSampler<PeerTarget>(chunkRate, () => rng.uniform());
    this.newcomer = options.newcomer;
    this.ledger = new LedgerSubmitter(node, validator, (n) => {
      this.summary.recorded += n;
    });
  }

  /** Whether workers must keep the state each step started from (anything may be re-run). */
  get keepsState(): boolean {
    return this.sampler.rate > 0 || this.redundancy > 1;
  }

  /**
   * A checked record arrived: sampled for re-execution with the job's rate (`sent`: a decoding step's session steps so
   * far), or, a decoding step that closed chunks of its session (`input`: the step's [rows, positions]), its chunks
   * sampled for a commitment check.
   */
  observe(worker: PeerTarget, record: WorkRecord, sent?: () => string[], input?: { shape: readonly number[] }): void {
    this.observed.push({ worker, record });
    this.summary.byBackend[record.backend] = (this.summary.byBackend[record.backend] ?? 0) + 1;
    // a decoding step is sampled by the chunks it closes; a step inside a chunk waits: covered once its chunk closes,
    // else (the session's tail) sampled for re-execution at the end
    if (record.kind === 'decode' && sent && input && this.chunks.rate > 0) {
      this.chunks.offer(worker, record, sent, input);
      return;
    }
    if (this.sampler.rate === 0) return;
    const newcomer = this.newcomer !== undefined && (this.passed.get(worker.peerId) ?? 0) < this.newcomer.checks;
    if (this.sampler.pick(newcomer ? Math.max(this.sampler.rate, this.newcomer!.rate) : this.sampler.rate)) {
      this.sampled.push({ worker, record, ...(sent ? { sent: sent() } : {}) });
    }
  }

  /**
   * Asks the validator to settle two copies' forwards that disagree by bisection (validator/dispute.ts): it bisects
   * their per-op values to one op and re-runs it alone. The losers are flagged and excluded, as a failed check's
   * worker is; an inconclusive dispute moves nothing (the caller re-runs the records instead).
   */
  async dispute(
    a: { worker: PeerTarget; record: WorkRecord }, b: { worker: PeerTarget; record: WorkRecord },
  ): Promise<{ losers: string[]; inconclusive?: boolean; reason: string }> {
    const { jobId, config } = this.context();
    const side = (s: typeof a) => ({ worker: { peerId: s.worker.peerId, addrs: s.worker.addrs }, record: s.record });
    const answer = await request(this.node, this.validator, { type: 'dispute', jobId, config, a: side(a), b: side(b) }, TRAIN_REQUEST_TIMEOUT_MS);
    const losers = Array.isArray(answer.losers) ? answer.losers.filter((l): l is string => typeof l === 'string') : [];
    const reason = typeof answer.reason === 'string' ? answer.reason : 'no reason given';
    if (answer.inconclusive === true) return { losers: [], inconclusive: true, reason };
    this.summary.disputes++;
    for (const peer of losers) {
      this.excluded.add(peer);
      if (!this.summary.flagged.includes(peer)) this.summary.flagged.push(peer);
    }
    return { losers, reason };
  }

  /**
   * Asks the validator to re-run one record of `worker`, or (`commit`) to check the sampled chunks of its decoding
   * session up to `record` by one prefill; a failed check flags the worker.
   */
  async audit(
    worker: PeerTarget, record: WorkRecord, sent?: string[], commit?: { checks: WorkRecord[]; chunks: number[] },
  ): Promise<AuditVerdict> {
    const { jobId, config, optimizer, adapter, base, factorsOf } = this.context();
    const factors = factorsOf?.(record.stage);
    const message = {
      type: 'audit', jobId, worker: { peerId: worker.peerId, addrs: worker.addrs }, config, optimizer, record,
      ...(sent ? { sent } : {}), ...(adapter ? { adapter } : {}), ...(base ? { base } : {}), ...(factors ? { factors } : {}),
      ...(commit ? { commit } : {}),
    };
    const answer = await request(this.node, this.validator, message, TRAIN_REQUEST_TIMEOUT_MS);
    const reason = typeof answer.reason === 'string' ? answer.reason : '';
    if (answer.inconclusive === true) throw new VerificationError(`the validator could not re-run a record of ${worker.peerId}: ${reason}`);
    // a worker the validator cannot reach is no evidence either way (it died, or restarted): left unchecked, and a failover
    // replaces it if the job still needs it
    if (answer.unavailable === true) throw new PeerUnreachableError(`the validator could not reach ${worker.peerId} to re-run its record: ${reason}`);
    this.summary.checked++;
    if (commit) this.summary.chunks += typeof answer.chunks === 'number' ? answer.chunks : 0;
    const ok = answer.ok === true;
    if (ok) this.passed.set(worker.peerId, (this.passed.get(worker.peerId) ?? 0) + 1);
    if (!ok && answer.unproven === true) {
      // it computed with factors other than this job gave it: the user's word, so not flagged; out of this job all the same
      this.excluded.add(worker.peerId);
      if (!this.summary.left.includes(worker.peerId)) this.summary.left.push(worker.peerId);
      return { ok, reason, peer: worker.peerId, unproven: true };
    }
    if (!ok) {
      // flagged by the validator, or (unavailable) it would not show what it signed: out of this job either way
      this.summary.failed++;
      this.excluded.add(worker.peerId);
      if (!this.summary.flagged.includes(worker.peerId)) this.summary.flagged.push(worker.peerId);
    }
    return { ok, reason, peer: worker.peerId };
  }

  /** Re-runs the records sampled since the last call, AUDIT_CONCURRENCY at a time; the verdicts that failed. */
  async auditSampled(): Promise<AuditVerdict[]> {
    // each worker's sampled chunks of a session: one commitment check (one prefill) each
    const chunked = this.chunks.take()
      .map((c) => ({ worker: c.hop, record: c.last, sent: c.sent, commit: { checks: c.checks, chunks: c.chunks } }));
    // the steps of a session no closed chunk covers: re-run at the job's rate
    for (const t of this.chunks.takeTails()) {
      if (this.sampler.rate === 0 || !this.sampler.pick(this.sampler.rate)) continue;
      this.sampled.push({ worker: t.hop, record: t.record, sent: t.sent() });
    }
    const batch: { worker: PeerTarget; record: WorkRecord; sent?: string[]; commit?: { checks: WorkRecord[]; chunks: number[] } }[] = [
      ...this.sampled, ...chunked,
    ];
    const observed = this.observed;
    this.sampled = [];
    this.observed = [];
    const failed: AuditVerdict[] = [];
    let next = 0;
    const lane = async () => {
      while (next < batch.length) {
        const { worker, record, sent, commit } = batch[next++];
        let v: AuditVerdict;
        try {
          v = await this.audit(worker, record, sent, commit);
        } catch (err) {
          // users and workers talk directly: a validator that is down (restarting) leaves records unchecked, not the job stopped
          if (!(err instanceof PeerUnreachableError)) throw err;
          this.summary.unchecked++;
          continue;
        }
        if (!v.ok) failed.push(v);
      }
    };
    await Promise.all(Array.from({ length: Math.min(AUDIT_CONCURRENCY, batch.length) }, lane));
    this.record(observed.filter((o) => !this.excluded.has(o.worker.peerId)).map((o) => o.record));
    return failed;
  }

  /** Hands checked records to the validator's ledger (LedgerSubmitter), each with this user's acceptance. */
  private record(records: WorkRecord[]): void {
    this.ledger.submit(records);
  }

  /** Waits for the ledger submissions under way; the first that failed, as an error (null: all were taken). */
  async drain(): Promise<Error | null> {
    return this.ledger.drain();
  }

  /**
   * Forgets the sampled records of a worker whose disagreement redundancy already settled: its
   * results that differed were never used (and the ones that agreed were right), so re-running
   * them again would only roll back a job that no wrong result reached.
   */
  forget(peer: string): void {
    this.sampled = this.sampled.filter((s) => s.worker.peerId !== peer);
  }

  /** Forgets sampled records (a step that failed, or a job rolled back). */
  discardSampled(): void {
    this.chunks.take();
    this.chunks.takeTails();
    this.sampled = [];
    this.observed = [];
  }
}
