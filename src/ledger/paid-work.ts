import { InvalidArgumentError } from '../errors.ts';

/** One record of an epoch, as far as pay goes. */
export interface EpochRecord {
  /** The worker that signed it. */
  peer: string;
  job: string;
  /** The user who accepted it (absent: nobody did). */
  user?: string;
  flops: number;
}

/** A job's escrow as the chain holds it (bound to the job and the user who runs it). */
export interface JobEscrow {
  /** The account that paid into it. */
  payer: string;
  /** What is left in it, in token units. */
  held: bigint;
}

/** What an escrow releases into the epoch's pool. */
export interface Release {
  job: string;
  user: string;
  amount: bigint;
}

export interface PaidWork {
  /** Each escrow's release, in (job, user) order; escrows that release nothing are left out. */
  releases: Release[];
  /** Each worker's paid work: FLOPs, scaled down where an escrow could not pay all it was due. */
  work: Map<string, number>;
}

/**
 * Which work an epoch pays, and what each job's escrow releases for it. A record is paid work
 * only when all of these hold:
 * - a user accepted it, and that user's escrow for the record's job holds tokens (records
 *   nobody accepted, or handed in by anyone but the user who paid, are never paid);
 * - its worker is not that user (a worker's own job), and the escrow's payer is not the
 *   worker's account (a job a worker paid for itself): such work earns no share of the pool,
 *   and its escrow is not released for it, so the payer gets it back as a refund and nothing more.
 * An escrow releases its paid FLOPs times `pricePerFlop`, at most what it holds; when it holds
 * less, each of its records counts for the share it paid (work × released / due), so a token
 * deposit cannot buy a share of the pool for much work.
 *
 * `escrowOf(job, user)`: the escrow, or undefined when there is none; `accountOf(peer)`: the
 * account a worker announced.
 */
export function paidWork(
  records: Iterable<EpochRecord>,
  escrowOf: (job: string, user: string) => JobEscrow | undefined,
  accountOf: (peer: string) => string | undefined,
  pricePerFlop: bigint,
): PaidWork {
  if (pricePerFlop <= 0n) throw new InvalidArgumentError('the price per FLOP must be positive');
  // escrow (job, user) → worker → FLOPs
  const byEscrow = new Map<string, { job: string; user: string; escrow: JobEscrow; flops: Map<string, bigint> }>();
  for (const r of records) {
    if (!Number.isSafeInteger(r.flops) || r.flops < 0) throw new InvalidArgumentError(`a record of ${r.peer} states ${r.flops} FLOPs`);
    if (r.user === undefined || r.user === r.peer || r.flops === 0) continue;
    const key = `${r.job}\n${r.user}`;
    let e = byEscrow.get(key);
    if (!e) {
      const escrow = escrowOf(r.job, r.user);
      if (!escrow || escrow.held <= 0n) continue;
      e = { job: r.job, user: r.user, escrow, flops: new Map() };
      byEscrow.set(key, e);
    }
    if (accountOf(r.peer)?.toLowerCase() === e.escrow.payer.toLowerCase()) continue;
    e.flops.set(r.peer, (e.flops.get(r.peer) ?? 0n) + BigInt(r.flops));
  }
  const releases: Release[] = [];
  const work = new Map<string, bigint>();
  const order = [...byEscrow.values()].sort((a, b) => (a.job === b.job ? compare(a.user, b.user) : compare(a.job, b.job)));
  for (const e of order) {
    const flops = [...e.flops.values()].reduce((a, b) => a + b, 0n);
    const due = flops * pricePerFlop;
    const amount = due < e.escrow.held ? due : e.escrow.held;
    if (amount === 0n) continue;
    releases.push({ job: e.job, user: e.user, amount });
    for (const [peer, f] of e.flops) work.set(peer, (work.get(peer) ?? 0n) + (f * amount) / due);
  }
  return { releases, work: new Map([...work].map(([peer, f]) => [peer, Number(f)])) };
}

/** A hosted span's job id (`host_NAME_HASH12_FIRST-LAST`, p2p's hostedJobId): the model's part of it is the escrow's job. */
const HOSTED_SPAN_JOB = /^(host_[A-Za-z0-9_-]{0,32}_[0-9a-f]{12})_[0-9]+-[0-9]+$/;

/** A job planned again (`UUID_rN_RANDOM`, p2p's replannedJobId): the first job's id is the escrow's job. */
const REPLANNED_JOB = /^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})_r[0-9]{1,9}_[0-9a-f]{8}$/;

/**
 * The job whose escrow pays a record of `job`: a hosted span's records are paid from the user's escrow for the whole
 * model (p2p's hostedModelJob: one deposit pays every host of every span it routes over); a job planned again (a
 * worker caught or lost) from its first's, which the user paid into; any other job's, its own. An escrow pays only
 * records its own user accepted, so no one else's job can draw on it under such a name.
 */
export function escrowJobOf(job: string): string {
  return HOSTED_SPAN_JOB.exec(job)?.[1] ?? REPLANNED_JOB.exec(job)?.[1] ?? job;
}

/** Code-unit order: the same on every validator, whatever its locale. */
function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
