import type { PeerId } from '@libp2p/interface';
import { InvalidArgumentError, InvalidMessageError, UnauthorizedError } from '../errors.ts';

/** Jobs a worker holds at once; more would only queue work it cannot do. */
export const MAX_JOBS_PER_WORKER = 64;

export interface JobEntry {
  jobId: string;
  /** The peer that opened the job: the only one that may drive or close it. */
  owner: string;
  /** Peers the owner allowed to pass activations on for this job (the previous stage of a chain). */
  delegates: Set<string>;
  openedAt: number;
}

/**
 * The jobs a worker serves, each bound to the peer that created it. Every request that
 * touches a job goes through `authorize`, so only its owner can drive its sessions.
 */
export class JobTable {
  private readonly jobs = new Map<string, JobEntry>();

  open(jobId: unknown, from: PeerId): JobEntry {
    const id = parseJobId(jobId);
    const existing = this.jobs.get(id);
    if (existing) {
      if (existing.owner !== from.toString()) throw new UnauthorizedError(`job ${id} belongs to another peer`);
      return existing;
    }
    if (this.jobs.size >= MAX_JOBS_PER_WORKER) throw new InvalidArgumentError(`this worker already holds ${MAX_JOBS_PER_WORKER} jobs`);
    const entry = { jobId: id, owner: from.toString(), delegates: new Set<string>(), openedAt: Date.now() };
    this.jobs.set(id, entry);
    return entry;
  }

  /** The job, if `from` owns it (or, with `delegates`, was allowed by its owner); a typed error otherwise. */
  authorize(jobId: unknown, from: PeerId, options: { delegates?: boolean } = {}): JobEntry {
    const id = parseJobId(jobId);
    const entry = this.jobs.get(id);
    if (!entry) throw new InvalidMessageError(`no job ${id} on this worker`);
    const who = from.toString();
    if (entry.owner !== who && !(options.delegates && entry.delegates.has(who))) {
      throw new UnauthorizedError(`only the owner of job ${id} may drive it`);
    }
    return entry;
  }

  close(jobId: unknown, from: PeerId): void {
    const entry = this.authorize(jobId, from);
    this.jobs.delete(entry.jobId);
  }

  /** Forgets a job (its owner's stream ended). */
  remove(jobId: string): void {
    this.jobs.delete(jobId);
  }

  get size(): number {
    return this.jobs.size;
  }
}

function parseJobId(v: unknown): string {
  if (typeof v !== 'string' || !/^[A-Za-z0-9_-]{1,64}$/.test(v)) throw new InvalidMessageError('jobId must be 1–64 letters, digits, _ or -');
  return v;
}
