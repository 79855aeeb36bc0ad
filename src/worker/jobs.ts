import type { PassInbox } from './passes.ts';
import type { ChunkCommitter, SectionCost, WorkRecord } from '../verify/index.ts';
import type { TrainingRecords } from './records.ts';
import type { PeerId } from '@libp2p/interface';
import { InvalidArgumentError, InvalidMessageError, RateLimitedError, UnauthorizedError } from '../errors.ts';
import type { CausalLM, KVCache, StepRunner } from '../models/index.ts';
import { type HostedSpan, newTraffic, parseJobId, type PeerTarget, type StageAssignment, type Traffic, type WeightEntry } from '../p2p/index.ts';
import type { GradientExchange, StageExecutor } from '../pipeline/index.ts';
import type { Tensor, WeightFormat } from '../tensor/index.ts';
import { pagesIf, syncPages } from './kv-pages.ts';
import type { MemoryBudget } from './memory.ts';

/** Jobs a worker holds at once; more would only queue work it cannot do. */
export const MAX_JOBS_PER_WORKER = 64;
/** Jobs one peer may hold on a worker: no one user fills the table and shuts the others out. */
export const MAX_JOBS_PER_PEER = 16;

/** Where an awaited chunk goes: a byte range of one of the section's weights (its float32 bytes, or its packed ones). */
export interface ChunkPlace {
  into: Uint8Array;
  offset: number;
  bytes: number;
}

/** A section built empty whose weights are arriving (manifest by manifest, chunk by chunk). */
export interface Loading {
  model: CausalLM;
  /** The section's weights by name: chunks are written into them as they come. */
  targets: Map<string, Tensor>;
  /** A compact section's matrices as their packed bytes arrive, by name (held packed at assemble). */
  packed: Map<string, Uint8Array>;
  /** The weights a manifest has listed so far. */
  listed: Map<string, WeightEntry>;
  /** Chunks not yet arrived, by address, and the places each fills. */
  waiting: Map<string, ChunkPlace[]>;
  /** Bytes of weights sent to the worker, and bytes it found in its own store or checkpoints. */
  received: number;
  reused: number;
  upstream?: string;
  range: [number, number];
  /** The sha256 of the config it was given (as JSON): its records name it. */
  configHash: string;
  /** The compact format its matrices are held in once assembled (absent: float32). */
  format?: WeightFormat;
  /** The hosted span whose weights the section shares (a job's adapter over a hosted model): only the factors arrive. */
  shared?: HostedSpan;
  /** `--fault stale-adapter`: the factors the job held before this load, put back at assemble over the ones that came. */
  stale?: Map<string, Float32Array>;
}

/** A section being trained on this worker. */
export interface Training {
  executor: StageExecutor;
  exchange: GradientExchange;
  /** Bytes of activations each micro-batch keeps for its backward (counted against the budget until then). */
  kept: Map<number, number>;
  recompute: boolean;
  /** Its signed records and what re-running them needs. */
  records: TrainingRecords;
  /** The last backward's contribution to the gradients: its hash (for its record), and on ort the tensors. */
  contribution: () => { hash: string; tensors: Map<string, Tensor> | null };
  /** Each micro-batch's forward input until its backward: its hash (the backward record names it) and, when kept, the tensor. */
  forwardInputs: Map<number, { hash: string; tensor: Tensor | null }>;
  /** Tensors the job's neighbours passed here ahead of the requests that use them. */
  passes: PassInbox;
  /**
   * Each micro-batch's gradients kept until the step for an ordered reduction (keepMicros): the bytes one takes (0: none
   * kept) and how many are held now, both counted against the budget.
   */
  micros: { bytes: number; held: number };
}

/** An inference session: its KV cache and the bytes the budget counts for it. */
export interface Session {
  cache: KVCache;
  /** On a hosted span: the peer whose session it is. */
  peer?: string;
  /** On a worker that computes on a device (webgpu): the session's steps as graphs there, its KV cache there too. */
  device?: StepRunner;
  lastUsed: number;
  /** Bytes the budget counts for it: its KV cache and the inputs it keeps. */
  kvBytes: number;
  /** Each step's inputs and record: what re-running a decoding step needs (the cache is rebuilt from them). */
  history: { input: Tensor; positions: Tensor; keyMask: Tensor | null; record: WorkRecord; output?: Tensor }[];
  /** A step of it is being computed now (asked by a user whose step is late: is it still here, or behind?). */
  busy?: boolean;
  /** Its chunk of positions under way, committed as it closes (activation commitments: verify/records/commit.ts). */
  committer?: ChunkCommitter;
  /** The last step's output, until the next: a speculative pass cut to its accepted positions is re-signed from it. */
  lastOutput?: Tensor;
}

/** A built section, its inference sessions (each with a KV cache) and its training state. */
export interface Section {
  model: CausalLM;
  /** Its global layer range [start, end): what its records name. */
  range: [number, number];
  /** The sha256 of the config it was built from (as JSON): its records name it. */
  configHash: string;
  /** The format its matrices are held in, and the bytes its weights hold (what `status` shows of it). */
  held: { format: WeightFormat | 'f32'; bytes: number };
  /** The hash of its weights for decoding records (a section that trains hashes through its records). */
  weightsHash?: string;
  /**
   * A host cheating on purpose (`--fault substitute:…`): the weights it announced, kept aside to hand over in audits
   * while it computes with others (the strongest form of the cheat: an audit that fetches weights sees the right ones).
   */
  announced?: Map<string, Tensor>;
  /** Decoding records signed so far. */
  seq?: number;
  /** What its computations cost (records state their FLOPs). */
  cost?: SectionCost;
  sessions: Map<string, Session>;
  training?: Training;
  /** The hosted span whose weights it shares (an adapter's job over a hosted model): it ends when the span leaves. */
  shared?: HostedSpan;
}

export interface JobEntry {
  jobId: string;
  /**
   * A span of a named model this worker hosts for anyone (`worker --host`), owned by the worker itself: any peer may
   * open sessions on it (each bound to the peer that opened it), nobody may load, train or close it.
   */
  hosted?: HostedSpan;
  /** The peer that opened the job: the only one that may drive or close it. */
  owner: string;
  /** Peers the owner allowed to send this job's gradients (its replicas, the other holder of a tied head). */
  delegates: Set<string>;
  /** Peers (validators) the owner allowed to fetch what re-running this job's records needs; nothing else. */
  verifiers: Set<string>;
  /** The previous stage of the job's chain, allowed to pass activations on (set once the section is built). */
  upstream?: string;
  /** Every section of the job, as its owner announced it: the only peers this worker dials for the job. */
  assignment: StageAssignment[];
  openedAt: number;
  loading?: Loading;
  section?: Section;
  /** Bytes this worker sent for the job (its owner adds them to its own for the job's traffic). */
  traffic: Traffic;
}

/** Counts frames this worker sends for a job: `kind` for tensor frames' bytes, their headers and control frames as control. */
export function countSent(job: JobEntry, kind: keyof Traffic, control: Uint8Array[], tensors: Uint8Array[] = []): void {
  for (const c of control) job.traffic.control += c.byteLength;
  for (const t of tensors) job.traffic[kind] += t.byteLength;
}

/**
 * The jobs a worker serves, each bound to the peer that created it, with everything the job
 * holds (its section while loading and once built). Every request that touches a job goes
 * through `authorize`, so only its owner (or a peer it delegated) can drive it; removing a
 * job frees all it held.
 */
export class JobTable {
  private readonly jobs = new Map<string, JobEntry>();

  /** `onRemove` runs after a job left the table (the worker frees what it held outside the entry: chunks in memory). */
  constructor(private readonly onRemove: (job: JobEntry) => void = () => {}) {}

  open(jobId: unknown, from: PeerId): JobEntry {
    const id = parseJobId(jobId);
    const existing = this.jobs.get(id);
    if (existing) {
      if (existing.owner !== from.toString()) throw new UnauthorizedError(`job ${id} belongs to another peer`);
      return existing;
    }
    if (this.jobs.size >= MAX_JOBS_PER_WORKER) throw new InvalidArgumentError(`this worker already holds ${MAX_JOBS_PER_WORKER} jobs`);
    const owner = from.toString();
    if ([...this.jobs.values()].filter((j) => j.owner === owner).length >= MAX_JOBS_PER_PEER) {
      throw new RateLimitedError(`you hold ${MAX_JOBS_PER_PEER} jobs on this worker already: close one first`);
    }
    const entry: JobEntry = {
      jobId: id, owner: from.toString(), delegates: new Set(), verifiers: new Set(), assignment: [],
      openedAt: Date.now(), traffic: newTraffic(),
    };
    this.jobs.set(id, entry);
    return entry;
  }

  /** A job for a span this worker hosts (see JobEntry.hosted): its own, served to anyone. */
  host(jobId: string, self: string, span: HostedSpan): JobEntry {
    if (this.jobs.has(jobId)) throw new InvalidArgumentError(`${span.name} blocks [${span.layers[0]}, ${span.layers[1]}] are hosted twice on this worker`);
    const entry: JobEntry = {
      jobId, hosted: span, owner: self, delegates: new Set(), verifiers: new Set(), assignment: [], openedAt: Date.now(),
      traffic: newTraffic(),
    };
    this.jobs.set(jobId, entry);
    return entry;
  }

  /** The spans of models this worker hosts (their entries). */
  hostedSpans(): JobEntry[] {
    return [...this.jobs.values()].filter((j) => j.hosted !== undefined);
  }

  /** The job, if `from` owns it (or, with `delegates`, was allowed by its owner); a typed error otherwise. */
  authorize(jobId: unknown, from: PeerId, options: { delegates?: boolean; verifiers?: boolean } = {}): JobEntry {
    const id = parseJobId(jobId);
    const entry = this.jobs.get(id);
    if (!entry) throw new InvalidMessageError(`no job ${id} on this worker`);
    // a hosted span is anyone's to use (the stage server lets only session requests through, each on the sender's own sessions)
    if (entry.hosted) return entry;
    const who = from.toString();
    const delegated = options.delegates === true && (entry.delegates.has(who) || entry.upstream === who);
    const verifier = options.verifiers === true && entry.verifiers.has(who);
    if (entry.owner !== who && !delegated && !verifier) {
      throw new UnauthorizedError(`only the owner of job ${id} may drive it`);
    }
    return entry;
  }

  /**
   * The peers this worker works with now, the most recent job's first: its jobs' owners, the rest of their assignments
   * and their delegates, its hosted sessions' users (what a worker behind NAT announces to the relay that carries them).
   */
  partners(self: string, max: number): string[] {
    const out = new Set<string>();
    for (const job of [...this.jobs.values()].reverse()) {
      const peers = job.hosted
        ? [...(job.section?.sessions.values() ?? [])].flatMap((s) => (s.peer ? [s.peer] : []))
        : [job.owner, ...job.assignment.map((s) => s.peerId), ...job.delegates, ...(job.upstream ? [job.upstream] : [])];
      for (const p of peers) if (p !== self && out.size < max) out.add(p);
    }
    return [...out];
  }

  /** Whether this entry is still the table's (not removed, nor replaced) between a request's header and its tensors. */
  holds(entry: JobEntry): boolean {
    return this.jobs.get(entry.jobId) === entry;
  }

  close(jobId: unknown, from: PeerId): void {
    const job = this.authorize(jobId, from);
    if (job.hosted) throw new UnauthorizedError(`${job.jobId} is a hosted model: it ends with its host, not by a user`);
    this.remove(job.jobId);
  }

  /** Forgets a job and all it held (its owner's stream ended). */
  remove(jobId: string): void {
    const job = this.jobs.get(jobId);
    if (!job) return;
    this.jobs.delete(jobId);
    this.onRemove(job);
    // jobs over a hosted span that leaves end with it: they share its buffers, which its budget no longer counts
    const span = job.hosted;
    if (!span) return;
    for (const j of [...this.jobs.values()]) if (j.section?.shared === span || j.loading?.shared === span) this.remove(j.jobId);
  }

  /** Forgets every job `peer` owns (it disconnected); returns how many. */
  removeOwnedBy(peer: string): number {
    const owned = [...this.jobs.values()].filter((j) => j.owner === peer);
    for (const job of owned) this.remove(job.jobId);
    return owned.length;
  }

  /** Where a peer of the job's assignment is reached; UnauthorizedError for a peer outside it (a worker dials no one else for a job). */
  peerOf(job: JobEntry, peerId: string): PeerTarget {
    const stage = job.assignment.find((s) => s.peerId === peerId);
    if (!stage) throw new UnauthorizedError(`${peerId} is not a worker of job ${job.jobId}; a job's messages go only to its own workers`);
    return { peerId: stage.peerId, addrs: stage.addrs };
  }

  /** Frees a session of a job's section (its KV cache, and what the budget counted for it). */
  dropSession(job: JobEntry, sessionId: string, memory: MemoryBudget): void {
    const session = job.section?.sessions.get(sessionId);
    if (!session) return;
    job.section!.sessions.delete(sessionId);
    // a session on a device frees its cache there now, not when its runner is collected
    session.device?.reset();
    memory.add(job.jobId, 'kv-cache', -session.kvBytes, 'closing a session');
    // a paged cache lets go of its pages (those of a prefix it shared stay with the others)
    session.cache.release();
    const pages = pagesIf(job.section!);
    if (pages) syncPages(pages, memory, job.jobId);
  }

  values(): IterableIterator<JobEntry> {
    return this.jobs.values();
  }

  get size(): number {
    return this.jobs.size;
  }
}
