import type { PeerId } from '@libp2p/interface';
import { InvalidMessageError, UnauthorizedError } from '../errors.ts';
import {
  type Announcement, type DialTarget, finite, type Handler, int, list, type Logger, obj, parseStatusAnswer, type PeerRecord, peerIdText,
  publicKeyOf, request, signerOf, str, type TensorLinkNode,
} from '../p2p/index.ts';
import { bytesSignatureValid, type Reputation, signBytes } from '../verify/index.ts';
import type { Registry } from './registry.ts';

/** Flags a validator keeps to hand to validators that join (the oldest forgotten first). */
export const MAX_FLAGS = 10_000;
/** How long a validator waits for another's answer while it shares a flag or catches up. */
const PEER_TIMEOUT_MS = 5_000;
/** Flags in one answer of `validator-flags` (each under 1 KiB: the page well under a control frame's 1 MiB). */
const FLAGS_PAGE = 500;
/** How often a validator reads again the flags of the others whose count moved (resync). */
export const FLAG_SYNC_MS = 10_000;
/** The registry pages a joining validator reads from one that runs (100 peers a page: 10,000 workers). */
const MAX_SYNC_PAGES = 100;

/**
 * A worker flagged by one validator, signed by it: the others exclude the worker too, as long as the signer is one of
 * their set. `key` names the check (the audit's record), so a flag that reaches a validator twice counts once.
 */
export interface SignedFlag {
  peer: string;
  reason: string;
  key: string;
  /** The validator that ran the check, and its Ed25519 signature of the fields above and `at`. */
  by: string;
  at: number;
  sig: string;
}

function flagBytes(f: Omit<SignedFlag, 'sig'>): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(['tensorlink-flag-v1', f.peer, f.reason, f.key, f.by, f.at]));
}

export function parseFlag(v: unknown, what = 'flag'): SignedFlag {
  const o = obj(v, what);
  return {
    peer: peerIdText(o.peer, `${what}.peer`),
    reason: str(o.reason, `${what}.reason`, 512),
    key: str(o.key, `${what}.key`, 256),
    by: peerIdText(o.by, `${what}.by`),
    at: finite(o.at, `${what}.at`, 0),
    sig: str(o.sig, `${what}.sig`, 200),
  };
}

/** The announcement a registry record stands for (what a validator that joins records of a worker another one knows). */
function announcementOf(p: PeerRecord): Announcement {
  return {
    roles: p.roles, capabilities: p.capabilities, addrs: p.addrs, proximity: p.proximity,
    ...(p.account ? { account: p.account } : {}), ...(p.sections ? { sections: p.sections } : {}), ...(p.hosts ? { hosts: p.hosts } : {}),
    ...(p.coordinate ? { coordinate: p.coordinate } : {}),
  };
}

/** The validators this one signs blocks with (ledger-service.ts), as the shared view needs them. */
export interface ValidatorPeers {
  /** Each one's id, how to reach it, and whether it answered the last round. */
  peers: ReadonlyMap<string, { target: DialTarget; alive: boolean }>;
  trusts(peer: string): boolean;
}

/**
 * What several validators share, so that a worker or a user may use any of them:
 * - the registry: workers' announcements spread over gossip among validators (each one relays what it accepted to the
 *   others it is connected to); a validator that joins (or restarts) first reads the registry of one that runs;
 * - reputation: a worker one validator flags is flagged by all; the flag is signed, pushed to every validator of the set,
 *   kept, and handed to a validator that joins;
 * - the view: `status` lists the validators of the set that answer beside the workers.
 */
export class SharedView {
  private readonly flags = new Map<string, SignedFlag>();
  /** Each validator's count of flags when this one last read them all (resync reads again only when it moved). */
  private readonly counts = new Map<string, number>();
  /** Set while a flag from another validator is applied: it is not shared again. */
  private applying = false;

  constructor(
    private readonly node: TensorLinkNode,
    private readonly validators: ValidatorPeers,
    private readonly registry: Registry,
    private readonly reputation: Reputation,
    private readonly log: Logger,
    /** Told of a flag another validator shared (the dashboard's events). */
    private readonly onShared: (flag: SignedFlag) => void = () => {},
  ) {
    reputation.onFlag = (peer, reason, key) => {
      if (!this.applying) void this.share(peer, reason, key);
    };
  }

  /** The other validators of the set that answered the last round, as `status` lists them. */
  records(now = Date.now()): PeerRecord[] {
    return [...this.validators.peers].filter(([, p]) => p.alive).map(([peerId, p]) => ({
      peerId, roles: ['validator'], capabilities: null, proximity: {}, lastSeen: now,
      addrs: 'peerId' in p.target ? p.target.addrs : [p.target.toString()],
    }));
  }

  handlers(): Record<string, Handler> {
    return {
      // a flag another validator of the set made (or passed on): checked, kept, its worker excluded here too
      'validator-flag': (m, from: PeerId) => {
        this.fromValidator(from);
        return { type: 'ack', applied: this.apply(parseFlag(m.flag)) };
      },
      // the flags this validator holds, for one that joins, FLAGS_PAGE at a time (`page`: the `next` of the last answer)
      'validator-flags': (m, from: PeerId) => {
        this.fromValidator(from);
        const page = int(m.page ?? 0, 'validator-flags.page', 0, MAX_FLAGS);
        const all = [...this.flags.values()];
        const next = page + FLAGS_PAGE < all.length ? { next: page + FLAGS_PAGE } : {};
        // `count`: only how many it holds (a resync asks that first, and reads the pages only when it moved)
        if (m.count === true) return { type: 'validator-flags', flags: [], total: all.length };
        return { type: 'validator-flags', flags: all.slice(page, page + FLAGS_PAGE), total: all.length, ...next };
      },
    };
  }

  /** Reads the registry and the flags of the validators of the set that answer (a validator that joins, or restarts). */
  async catchUp(): Promise<void> {
    await Promise.all([...this.validators.peers].filter(([, p]) => p.alive).map(async ([id, p]) => {
      let applied = 0;
      try {
        applied = await this.pullFlags(id, p.target);
      } catch (err) {
        this.log.warn('validator-catch-up-failed', { from: id, what: 'flags', error: (err as Error).message });
      }
      try {
        let workers = 0;
        for (let page: number | undefined = 0, n = 0; page !== undefined && n < MAX_SYNC_PAGES; n++) {
          const status = parseStatusAnswer(await request(this.node, p.target, { type: 'status', page }, PEER_TIMEOUT_MS));
          for (const r of status.peers) {
            if (r.roles.includes('validator') || this.registry.knows(r.peerId)) continue;
            this.registry.record(r.peerId, announcementOf(r));
            workers++;
          }
          page = status.next;
        }
        this.log.info('validator-caught-up', { from: id, workers, flags: applied });
      } catch (err) {
        this.log.warn('validator-catch-up-failed', { from: id, what: 'registry', error: (err as Error).message });
      }
    }));
  }

  /**
   * Reads again the flags of each validator of the set that answers whose count moved since the last read (every
   * FLAG_SYNC_MS): a flag whose push did not reach this one (it was unreachable a while, not restarted) arrives so.
   */
  async resync(): Promise<void> {
    await Promise.all([...this.validators.peers].filter(([, p]) => p.alive).map(async ([id, p]) => {
      try {
        const first = await request(this.node, p.target, { type: 'validator-flags', page: 0, count: true }, PEER_TIMEOUT_MS);
        const total = int(first.total ?? -1, 'validator-flags.total', -1, MAX_FLAGS);
        if (total >= 0 && this.counts.get(id) === total) return;
        const applied = await this.pullFlags(id, p.target);
        if (applied > 0) this.log.info('flags-resynced', { from: id, flags: applied });
      } catch (err) {
        this.log.debug('flag-resync-failed', { from: id, error: (err as Error).message });
      }
    }));
  }

  /** Reads every page of a validator's flags and applies those new here (each on its own); how many were new. */
  private async pullFlags(id: string, target: DialTarget): Promise<number> {
    let applied = 0;
    for (let page: number | undefined = 0; page !== undefined;) {
      const answer = await request(this.node, target, { type: 'validator-flags', page }, PEER_TIMEOUT_MS);
      if (page === 0 && answer.total !== undefined) this.counts.set(id, int(answer.total, 'validator-flags.total', 0, MAX_FLAGS));
      for (const raw of list(answer.flags, 'validator-flags.flags', FLAGS_PAGE, (v) => v)) {
        try {
          if (this.apply(parseFlag(raw))) applied++;
        } catch (err) {
          // a flag this validator does not take (its signer outside this one's set, a signature that does not check)
          this.log.warn('flag-refused', { from: id, error: (err as Error).message });
        }
      }
      page = answer.next === undefined ? undefined : int(answer.next, 'validator-flags.next', page + 1, MAX_FLAGS);
    }
    return applied;
  }

  /** Applies a flag another validator signed: false if it was known, or its signer is not of the set, or it does not check. */
  apply(flag: SignedFlag): boolean {
    const id = `${flag.by} ${flag.peer} ${flag.key}`;
    if (this.flags.has(id)) return false;
    if (!this.validators.trusts(flag.by)) throw new UnauthorizedError(`a flag signed by ${flag.by}, not a validator of this set`);
    const { sig, ...signed } = flag;
    if (!bytesSignatureValid(flagBytes(signed), sig, publicKeyOf(flag.by))) throw new InvalidMessageError(`a flag of ${flag.peer} whose signature does not check`);
    this.keep(id, flag);
    this.applying = true;
    try {
      this.reputation.check(flag.peer, false, `${flag.reason} (flagged by validator ${flag.by.slice(-8)})`, `flag:${flag.by}:${flag.key}`);
    } finally {
      this.applying = false;
    }
    this.onShared(flag);
    return true;
  }

  /** Signs this validator's flag of `peer` and pushes it to every validator of the set (those down get it when they join). */
  private async share(peer: string, reason: string, key: string | undefined): Promise<void> {
    const signer = signerOf(this.node);
    const fields = { peer, reason: reason.slice(0, 512), key: (key ?? `excluded:${Date.now()}`).slice(0, 256), by: signer.peer, at: Date.now() };
    const flag: SignedFlag = { ...fields, sig: signBytes(flagBytes(fields), signer) };
    this.keep(`${flag.by} ${flag.peer} ${flag.key}`, flag);
    await Promise.all([...this.validators.peers].map(async ([id, p]) => {
      try {
        await request(this.node, p.target, { type: 'validator-flag', flag }, PEER_TIMEOUT_MS);
      } catch (err) {
        this.log.warn('flag-not-shared', { peer: id, flagged: peer, error: (err as Error).message });
      }
    }));
  }

  private keep(id: string, flag: SignedFlag): void {
    this.flags.set(id, flag);
    if (this.flags.size > MAX_FLAGS) this.flags.delete(this.flags.keys().next().value as string);
  }

  private fromValidator(from: PeerId): void {
    if (!this.validators.trusts(from.toString())) throw new UnauthorizedError(`${from.toString()} is not a validator of this set (--peers, --validators)`);
  }
}
