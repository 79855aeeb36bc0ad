import { InvalidMessageError } from '../errors.ts';
import type { Announcement, Logger, PeerRecord } from '../p2p/index.ts';

/** A worker that has not announced itself for this long is dropped from the registry (it refreshes every 2 s). */
export const PEER_TTL_MS = 10_000;

/**
 * The validator's registry of live peers, fed by their announcements (direct or gossiped,
 * both already parsed), each kept for PEER_TTL_MS after it was last heard.
 */
export class Registry {
  private readonly records = new Map<string, PeerRecord>();
  /** Each peer's Ethereum account as it last announced it: kept after the peer leaves, so work it did is still paid. */
  private readonly accounts = new Map<string, string>();
  /** The peers each worker behind NAT says it works with (its relay carries their traffic as a job's); never shown. */
  private readonly partners = new Map<string, Set<string>>();

  constructor(
    private readonly log: Logger,
    /** Told when a peer joins or is dropped (the dashboard's events). */
    private readonly onChange: (kind: 'joined' | 'left', peer: string, roles: readonly string[]) => void = () => {},
    /** Its clock (a simulation's virtual one: src/sim/). */
    private readonly now: () => number = Date.now,
  ) {}

  /** Records an announcement from an authenticated peer (throws on one that claims to be a validator). */
  record(from: string, a: Announcement): void {
    if (a.roles.includes('validator')) throw new InvalidMessageError('a peer cannot announce itself as a validator');
    if (!this.records.has(from)) {
      this.log.info('peer-joined', { remote: from, roles: a.roles });
      this.onChange('joined', from, a.roles);
    }
    if (a.account) this.accounts.set(from, a.account);
    const { peers, ...shown } = a;
    if (peers) this.partners.set(from, new Set(peers));
    // proximity only to peers the registry knows: made-up peer ids would only swell every status answer
    const proximity = Object.fromEntries(Object.entries(a.proximity).filter(([peer]) => this.records.has(peer)));
    this.records.set(from, { peerId: from, ...shown, proximity, lastSeen: this.now() });
  }

  accountOf(peer: string): string | undefined {
    return this.accounts.get(peer);
  }

  /** The memory a live peer offers (its announced capabilities), or null. */
  offers(peer: string): number | null {
    return this.knows(peer) ? (this.records.get(peer)?.capabilities?.memoryBytes ?? null) : null;
  }

  /** Whether live peer `a` announced `b` among the peers it works with. */
  worksWith(a: string, b: string): boolean {
    return this.knows(a) && (this.partners.get(a)?.has(b) ?? false);
  }

  /** Whether a peer announced itself within PEER_TTL_MS. */
  knows(peer: string): boolean {
    const r = this.records.get(peer);
    return r !== undefined && this.now() - r.lastSeen <= PEER_TTL_MS;
  }

  /** The live peers, sorted by peer id (the silent ones are dropped first). */
  live(): PeerRecord[] {
    const now = this.now();
    for (const [id, r] of this.records) {
      if (now - r.lastSeen <= PEER_TTL_MS) continue;
      this.records.delete(id);
      this.partners.delete(id);
      this.log.info('peer-dropped', { remote: id, silentMs: now - r.lastSeen });
      this.onChange('left', id, r.roles);
    }
    return [...this.records.values()].sort((a, b) => a.peerId.localeCompare(b.peerId));
  }
}

/** How old (or how far ahead of this clock) a gossiped announcement may be: its publisher sends one every 2 s. */
export const GOSSIP_FRESH_MS = 30_000;

/**
 * Gossiped announcements are signed by their publishers, but anyone who kept one can publish it again later (gossip's own
 * seen-cache forgets after minutes): one counts only when it says when it was made, within GOSSIP_FRESH_MS of now, and
 * after the last one of its publisher. A replayed record cannot bring back a worker that left, or its old addresses.
 */
export class GossipFreshness {
  private readonly last = new Map<string, number>();

  constructor(private readonly now: () => number = Date.now) {}

  check(peer: string, a: Announcement): Announcement {
    const now = this.now();
    if (a.at === undefined) throw new InvalidMessageError('a gossiped announcement must say when it was made (at)');
    if (Math.abs(now - a.at) > GOSSIP_FRESH_MS) throw new InvalidMessageError(`a gossiped announcement made ${Math.round((now - a.at) / 1000)} s ago`);
    if (a.at <= (this.last.get(peer) ?? -1)) throw new InvalidMessageError('a gossiped announcement no newer than the last one (a replay)');
    this.last.set(peer, a.at);
    if (this.last.size > 100_000) for (const [p, at] of this.last) if (now - at > GOSSIP_FRESH_MS) this.last.delete(p);
    return a;
  }
}
