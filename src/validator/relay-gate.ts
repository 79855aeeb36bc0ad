import type { RelayCircuit, RelayGate } from '../p2p/index.ts';

/** How long a peer that asked the validator something counts as known to its relay. */
export const KNOWN_FOR_MS = 3_600_000;

/**
 * What a validator's relay carries. A pair with work between them (the destination, the worker behind NAT holding the
 * slot, announced the source among the peers it works with: a job's owner or assignment, a hosted session's user) is
 * carried as a job's transfers need: a section's weights in, then its activations; all of one destination's such pairs
 * together get one job's budget too. Any other pair gets what first contact needs (WebRTC signalling, opening a job,
 * link probes of 256 KiB every 10 s each way): a few MiB at once and a slow trickle after. Each is a budget that refills
 * at its rate (a token bucket), so a pair cannot renew it by dialling again.
 */
export interface RelayLimits {
  /** A pair with work between them: bytes at once, and bytes a second after (both ways together). */
  jobBytes: number;
  jobBytesPerSecond: number;
  /** A relayed connection of such a pair lasts at most this long (the next dial makes a new one). */
  jobMs: number;
  /** A pair without: bytes at once, and bytes a second after. */
  contactBytes: number;
  contactBytesPerSecond: number;
  /** A relayed connection of such a pair lasts at most this long. */
  contactMs: number;
  /** Relayed connections one peer, and one IP address, may have open at once. */
  circuitsPerPeer: number;
  circuitsPerIp: number;
  /** Relay slots taken from one IP address (a home's workers share one). */
  reservationsPerIp: number;
}

/**
 * The defaults: a job's pair moves a 16 GiB section's weights at once and 16 GiB an hour after (a destination that
 * offers less memory gets twice what it offers: ValidatorRelayGate's budget); a contact pair 64 MiB at
 * once (a first hosted step's hidden states, the first chunks of a load before the worker's announcement names its new
 * owner) and 128 KiB/s after (two link probes every 10 s take 51 KiB/s).
 */
export const RELAY_LIMITS: RelayLimits = {
  jobBytes: 16 * 2 ** 30,
  jobBytesPerSecond: (16 * 2 ** 30) / 3600,
  jobMs: 24 * 3_600_000,
  contactBytes: 64 * 2 ** 20,
  contactBytesPerSecond: 128 * 1024,
  contactMs: 10 * 60_000,
  circuitsPerPeer: 32,
  circuitsPerIp: 256,
  reservationsPerIp: 32,
};

/** What the relay has cut so far, and why. */
export interface RelayStats {
  /** Relayed connections open now, and bytes carried so far (charged as the relay takes them, either way). */
  circuits: number;
  bytes: number;
  /** Connections refused (strangers, pairs past their budget, peers past their connections). */
  refused: number;
  cut: { contact: number; job: number; duration: number };
}

/** A pair's budget: bytes it may still move, refilled at its rate up to its size. */
interface Bucket {
  bytes: number;
  at: number;
}

/**
 * Whom a validator's relay serves, and how much: slots for workers that announced themselves (a worker behind NAT takes
 * its slot after its first announcement), at most `reservationsPerIp` from one address; relayed connections from the
 * peers it knows (those workers, and users that asked it something within KNOWN_FOR_MS) to a peer holding a slot, each
 * pair within its budget (RelayLimits), at most `circuitsPerPeer` at once. Everyone else is refused: the relay is the
 * swarm's, not a free tunnel.
 */
export class ValidatorRelayGate implements RelayGate {
  private readonly asked = new Map<string, number>();
  private readonly buckets = new Map<string, Bucket>();
  private readonly open = new Map<string, number>();
  private readonly openByIp = new Map<string, number>();
  private readonly slotsByIp = new Map<string, Set<string>>();
  private readonly counts: RelayStats = { circuits: 0, bytes: 0, refused: 0, cut: { contact: 0, job: 0, duration: 0 } };
  readonly limits: RelayLimits;

  constructor(
    private readonly announced: (peer: string) => boolean,
    /** Whether `a` announced `b` among the peers it works with (a job or a session between them). */
    private readonly worksWith: (a: string, b: string) => boolean,
    limits: Partial<RelayLimits> = {},
    private readonly now: () => number = Date.now,
    /** The memory a peer offers (its announced `--memory`), or null where it announced none. */
    private readonly offers: (peer: string) => number | null = () => null,
  ) {
    this.limits = { ...RELAY_LIMITS, ...limits };
  }

  /** A peer asked the validator something (any control request). */
  heard(peer: string): void {
    this.asked.set(peer, this.now());
    if (this.asked.size > 100_000) for (const [p, at] of this.asked) if (at < this.now() - KNOWN_FOR_MS) this.asked.delete(p);
  }

  mayReserve(peer: string, ip: string | null): boolean {
    if (!this.announced(peer)) return false;
    if (ip === null) return true;
    const slots = this.slotsByIp.get(ip) ?? new Set<string>();
    // a slot of a peer that left (or moved) is not held against its address
    for (const p of slots) if (!this.announced(p)) slots.delete(p);
    if (!slots.has(peer) && slots.size >= this.limits.reservationsPerIp) return false;
    slots.add(peer);
    this.slotsByIp.set(ip, slots);
    return true;
  }

  mayConnect(from: string, to: string, ip: string | null): boolean {
    const known = this.announced(from) || (this.asked.get(from) ?? 0) >= this.now() - KNOWN_FOR_MS;
    const ok = known
      && (this.open.get(from) ?? 0) < this.limits.circuitsPerPeer
      && (ip === null || (this.openByIp.get(ip) ?? 0) < this.limits.circuitsPerIp)
      && this.left(from, to) > 0;
    if (!ok) this.counts.refused++;
    return ok;
  }

  /** A relayed connection from `from` to `to` opened: what it carries is charged to the pair, and cut past its budget. */
  circuit(from: string, to: string, ip: string | null): RelayCircuit {
    const opened = this.now();
    this.counts.circuits++;
    bump(this.open, from, 1);
    if (ip !== null) bump(this.openByIp, ip, 1);
    let closed = false;
    return {
      carry: (bytes: number): string | null => {
        const job = this.paired(from, to);
        if (this.now() - opened > (job ? this.limits.jobMs : this.limits.contactMs)) {
          this.counts.cut.duration++;
          return `a relayed connection lasts at most ${Math.round((job ? this.limits.jobMs : this.limits.contactMs) / 1000)} s`;
        }
        // a chunk past what is left is not carried: the pair moves at most its budget, and a job's traffic to one
        // destination, all its pairs together, at most one job's budget (a slot holder naming peers of its own gets
        // no more than one job's worth of relay)
        const bucket = this.bucket(from, to);
        const shared = job ? this.bucket('*', to) : null;
        if (bucket.bytes >= bytes && (shared === null || shared.bytes >= bytes)) {
          bucket.bytes -= bytes;
          if (shared) shared.bytes -= bytes;
          this.counts.bytes += bytes;
          return null;
        }
        bucket.bytes = 0;
        this.counts.cut[job ? 'job' : 'contact']++;
        return job
          ? `past the relay's limit for a job's transfers (${this.budget(true, to)[0]} bytes at once)`
          : `past the relay's limit for peers without a job or session between them (${this.limits.contactBytes} bytes)`;
      },
      closed: () => {
        if (closed) return;
        closed = true;
        bump(this.open, from, -1);
        if (ip !== null) bump(this.openByIp, ip, -1);
      },
    };
  }

  stats(): RelayStats {
    return { ...this.counts, cut: { ...this.counts.cut }, circuits: [...this.open.values()].reduce((a, b) => a + b, 0) };
  }

  /** Whether the destination (the slot holder: a worker behind NAT) named the source among the peers it works with. */
  private paired(from: string, to: string): boolean {
    return this.worksWith(to, from);
  }

  /** Bytes the pair may still move now. */
  private left(from: string, to: string): number {
    return this.bucket(from, to).bytes;
  }

  /**
   * The pair's budget, refilled to now: a job's once the pair works together (what it moved before stays spent).
   * `from` '*': the destination's job budget for all its pairs together.
   */
  private bucket(from: string, to: string): Bucket {
    const job = from === '*' || this.paired(from, to);
    const key = `${job ? 'job' : 'contact'} ${from} ${to}`;
    const [size, rate] = this.budget(job, to);
    const now = this.now();
    let b = this.buckets.get(key);
    if (!b) {
      if (this.buckets.size > 100_000) this.forgetFull(now);
      b = { bytes: size, at: now };
      this.buckets.set(key, b);
    }
    b.bytes = Math.min(size, b.bytes + ((now - b.at) / 1000) * rate);
    b.at = now;
    return b;
  }

  /**
   * A pair's budget: its size in bytes, and bytes a second it refills. A job's is sized from the destination: a job moves
   * into a worker at most what it holds, so twice the memory the destination offers (a section's weights, and room for
   * its activations and a reload), never less than first contact's nor more than `jobBytes`; it refills over the same
   * time as `jobBytes` at `jobBytesPerSecond`. A worker behind NAT that names peers of its own gets no more than its own
   * size's worth, not 16 GiB.
   */
  private budget(job: boolean, to: string): [number, number] {
    if (!job) return [this.limits.contactBytes, this.limits.contactBytesPerSecond];
    const offered = this.offers(to);
    if (offered === null) return [this.limits.jobBytes, this.limits.jobBytesPerSecond];
    const size = Math.min(this.limits.jobBytes, Math.max(this.limits.contactBytes, 2 * offered));
    return [size, Math.max(this.limits.contactBytesPerSecond, (this.limits.jobBytesPerSecond * size) / this.limits.jobBytes)];
  }

  /** Drops the buckets that have refilled (a pair that comes back starts full, as it would from them). */
  private forgetFull(now: number): void {
    for (const [key, b] of this.buckets) {
      const [kind, , to] = key.split(' ');
      const [size, rate] = this.budget(kind === 'job', to);
      if (b.bytes + ((now - b.at) / 1000) * rate >= size) this.buckets.delete(key);
    }
  }
}

function bump(counts: Map<string, number>, key: string, by: number): void {
  const n = (counts.get(key) ?? 0) + by;
  if (n <= 0) counts.delete(key);
  else counts.set(key, n);
}
