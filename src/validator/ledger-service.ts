import type { PeerId } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { InvalidArgumentError, InvalidMessageError, PeerUnreachableError, UnauthorizedError } from '../errors.ts';
import {
  acceptanceValid, type Block, blockProblem, entryKey, headerHash, inclusionProof, type LedgerRecord, makeBlock, type SignerSet, signHeader,
  validSigners,
} from '../ledger/index.ts';
import {
  type DialTarget, type Handler, int, type LedgerSummary, type Logger, OVERVIEW_LIMITS, publicKeyOf, request, signerOf, str,
  type TensorLinkNode,
} from '../p2p/index.ts';
import { recordId, type RecordSigner, type Reputation, signatureValid } from '../verify/index.ts';
import {
  type Head, MAX_BLOCK_RECORDS, parseBlockMessage, parseBlocksAnswer, parseHead, parseHello, parseSubmit,
} from './ledger-messages.ts';
import { LedgerStore } from './ledger-store.ts';
import { Slots } from '../p2p/index.ts';

/** How often the ledger looks at its peers and makes a block of what is pending. */
export const BLOCK_INTERVAL_MS = 300;
/** A peer validator that does not answer within this is taken as down until it answers again. */
export const PEER_TIMEOUT_MS = 3_000;
/** A submission is answered once its records are in a block; past this the submitter is told to try again. */
export const SUBMIT_TIMEOUT_MS = 60_000;
/** Records waiting for a block at most: past it a submission is refused (the ledger is behind). */
export const MAX_PENDING = 200_000;

export interface LedgerOptions {
  dataDir?: string;
  /** Other validators to co-sign blocks with (they learn of this one when it says hello). */
  peers?: string[];
  /**
   * Peer ids of further validators whose hello this one accepts (they dial it; it need not know
   * their addresses). Only the validators of `peers` and `validators` sign blocks and settlements
   * with this one: any other peer may read the ledger, but its signatures do not count.
   */
  validators?: string[];
  /** Validator signatures a block needs (default 1: the proposer's own). */
  threshold?: number;
  /** This validator's Ethereum account, told to its peers (settlement needs every validator's). */
  account?: string;
  log: Logger;
}

interface PeerValidator {
  target: DialTarget;
  alive: boolean;
  head: Head | null;
}

/** A worker's standing in the ledger: its accepted records and their FLOPs. */
export interface LedgerWork {
  records: number;
  flops: number;
}

/**
 * A validator's ledger: users hand it the records they accepted; every BLOCK_INTERVAL_MS the
 * leader (the live validator with the lowest peer id) puts the pending ones into a block, has
 * its peers co-sign the header, appends it (synced to disk) and tells them to append it too.
 * A validator behind its peers (new, or restarted) catches up block by block, each checked.
 * A submission is answered when its records are in a block: what was acknowledged survives
 * a restart.
 */
export class LedgerService {
  readonly store: LedgerStore;
  private readonly signer: RecordSigner;
  /** Records waiting for a block, by entry (`entryKey`: a record once per user who accepted it). */
  private readonly pending = new Map<string, LedgerRecord>();
  private readonly waiters = new Map<string, (() => void)[]>();
  /** Record id → the height of the first block that holds it. */
  private readonly index = new Map<string, number>();
  /** The entries in blocks. */
  private readonly entries = new Set<string>();
  readonly peers = new Map<string, PeerValidator>();
  private readonly lock = new Slots(1);
  private timer: ReturnType<typeof setInterval> | null = null;
  private ticking = false;
  readonly threshold: number;
  /** This validator and the others it co-signs with: the only signatures its blocks count. */
  private readonly trusted: ReadonlySet<string>;
  private readonly configured: { id: string; target: DialTarget }[];

  constructor(
    private readonly node: TensorLinkNode,
    private readonly reputation: Reputation,
    private readonly options: LedgerOptions,
  ) {
    this.threshold = options.threshold ?? 1;
    if (!Number.isInteger(this.threshold) || this.threshold < 1) throw new InvalidArgumentError(`the ledger threshold must be an integer ≥ 1, got ${this.threshold}`);
    this.signer = signerOf(node);
    this.configured = (options.peers ?? []).map((addr) => {
      const ma = multiaddr(addr);
      const id = ma.getComponents().find((c) => c.name === 'p2p')?.value;
      if (!id) throw new InvalidArgumentError(`--peers: ${addr} does not end in /p2p/PEER-ID`);
      return { id, target: ma };
    });
    for (const v of options.validators ?? []) publicKeyOf(v);
    this.trusted = new Set([node.peerId.toString(), ...this.configured.map((c) => c.id), ...(options.validators ?? [])]);
    this.store = new LedgerStore(options.dataDir, this.signers());
    for (let h = 0; h < this.store.height; h++) this.indexBlock(this.store.at(h)!);
  }

  private signers(): SignerSet {
    return { keyOf: publicKeyOf, threshold: this.threshold, validators: this.trusted };
  }

  /** Says hello to the configured peers, catches up from them, and starts making blocks. */
  async start(): Promise<void> {
    for (const { id, target: ma } of this.configured) {
      this.peers.set(id, { target: ma, alive: false, head: null });
      try {
        const head = parseHead(await request(this.node, ma, { type: 'ledger-hello', addrs: this.node.getMultiaddrs().map(String) }, PEER_TIMEOUT_MS));
        this.peers.set(id, { target: ma, alive: true, head });
      } catch (err) {
        this.options.log.warn('validator-unreachable', { peer: id, error: (err as Error).message });
      }
    }
    await this.catchUp();
    this.timer = setInterval(() => void this.tick(), BLOCK_INTERVAL_MS);
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  head(): Head {
    return { height: this.store.height, hash: this.store.headHash(), ...(this.options.account ? { account: this.options.account } : {}) };
  }

  get pendingCount(): number {
    return this.pending.size;
  }

  /** The block holding record `id` (undefined: none does). */
  heightOf(id: string): number | undefined {
    return this.index.get(id);
  }

  /** Each worker's accepted records and FLOPs in blocks [from, to). */
  work(from = 0, to = this.store.height): Map<string, LedgerWork> {
    const out = new Map<string, LedgerWork>();
    for (let h = from; h < to; h++) {
      for (const r of this.store.at(h)!.records) {
        const w = out.get(r.peer) ?? { records: 0, flops: 0 };
        w.records++;
        w.flops += r.flops ?? 0;
        out.set(r.peer, w);
      }
    }
    return out;
  }

  handlers(): Record<string, Handler> {
    return {
      'ledger-submit': (m) => this.submit(parseSubmit(m)),
      'ledger-hello': (m, from: PeerId) => {
        const id = from.toString();
        const addrs = parseHello(m);
        // a peer outside the validator set is answered (it may catch up, as anyone may read the ledger), not co-signed with
        if (this.trusted.has(id)) {
          this.peers.set(id, { target: { peerId: id, addrs }, alive: true, head: null });
          this.options.log.info('validator-joined', { peer: id });
        } else this.options.log.warn('validator-not-trusted', { peer: id });
        return { type: 'ledger-head', ...this.head() };
      },
      'ledger-head': () => ({ type: 'ledger-head', ...this.head() }),
      'ledger-blocks': (m) => {
        const block = this.store.at(int(m.from, 'from'));
        return { type: 'ledger-blocks', blocks: block ? [block] : [] };
      },
      'ledger-propose': (m, from: PeerId) => this.cosign(parseBlockMessage(m.block), this.validatorOf(from)),
      'ledger-commit': async (m, from: PeerId) => {
        this.validatorOf(from);
        const block = parseBlockMessage(m.block);
        await this.lock.run(async () => {
          if (block.header.height === this.store.height) this.append(block);
        });
        if (block.header.height > this.store.height) await this.catchUpFrom(from.toString());
        return { type: 'ledger-head', ...this.head() };
      },
      'ledger-show': (m) => this.show(m.height === undefined ? undefined : int(m.height, 'height')),
      'ledger-proof': (m) => {
        const id = str(m.record, 'record', 64);
        const height = this.index.get(id);
        if (height === undefined) {
          const pending = [...this.pending.values()].some((r) => recordId(r) === id);
          const why = pending ? 'is pending: it will be in the next block' : 'is in no block of this ledger';
          throw new InvalidArgumentError(`record ${id} ${why}`);
        }
        return { type: 'ledger-proof', proof: inclusionProof(this.store.at(height)!, id) };
      },
    };
  }

  /** Whether `peer` is one of the validators this one co-signs with. */
  trusts(peer: string): boolean {
    return this.trusted.has(peer);
  }

  /** The peer id of a validator of this one's set (an UnauthorizedError for anyone else). */
  validatorOf(from: PeerId): string {
    const id = from.toString();
    if (!this.trusted.has(id)) throw new UnauthorizedError(`${id} is not a validator this one signs with (--peers, --validators)`);
    return id;
  }

  /**
   * Takes records a user accepted (signed by their workers, and each by the user who accepted it,
   * not yet in the ledger); answers once they are in a block. A record whose worker or user
   * signature does not check is refused; one without a user's acceptance goes into the ledger
   * but is never paid.
   */
  async submit(records: LedgerRecord[]): Promise<Record<string, unknown>> {
    let accepted = 0;
    let duplicate = 0;
    let refused = 0;
    const waits: Promise<void>[] = [];
    for (const r of records) {
      const id = entryKey(r);
      if (this.entries.has(id)) {
        duplicate++;
        continue;
      }
      let key: Uint8Array | null = null;
      try {
        key = publicKeyOf(r.peer);
      } catch {
        // not an Ed25519 peer id: it cannot have signed
      }
      if (!key || !signatureValid(r, key) || !acceptanceValid(r, publicKeyOf) || this.reputation.excluded(r.peer)) {
        refused++;
        continue;
      }
      if (!this.pending.has(id)) {
        if (this.pending.size >= MAX_PENDING) throw new PeerUnreachableError(`the ledger has ${MAX_PENDING} records waiting for blocks; submit again later`);
        this.pending.set(id, r);
        accepted++;
      } else duplicate++;
      waits.push(new Promise((resolve) => {
        const list = this.waiters.get(id) ?? [];
        list.push(resolve);
        this.waiters.set(id, list);
      }));
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new PeerUnreachableError(`the records were not put into a block within ${SUBMIT_TIMEOUT_MS} ms`)), SUBMIT_TIMEOUT_MS);
    });
    try {
      await Promise.race([Promise.all(waits), late]);
    } finally {
      clearTimeout(timer);
    }
    return { type: 'ledger-accepted', accepted, duplicate, refused, height: this.store.height };
  }

  /** The ledger at a glance (the dashboard's): height, records, the newest blocks, each worker's accepted work. */
  summary(): LedgerSummary {
    // each worker's work is a walk over every record: done again only when a block was added
    if (this.workCache?.height !== this.store.height) this.workCache = { height: this.store.height, work: Object.fromEntries(this.work()) };
    const blocks = this.store.from(Math.max(0, this.store.height - OVERVIEW_LIMITS.blocks)).map((b) => ({
      height: b.header.height, count: b.header.count, time: b.header.time, signers: b.signatures.length,
    }));
    return {
      height: this.store.height, records: this.index.size, pending: this.pending.size, hash: this.store.headHash(), blocks,
      work: this.workCache.work,
    };
  }

  private workCache: { height: number; work: LedgerSummary['work'] } | null = null;

  private show(height: number | undefined): Record<string, unknown> {
    if (height === undefined) {
      const work = Object.fromEntries([...this.work()].map(([peer, w]) => [peer, w]));
      const last = this.store.head;
      return {
        type: 'ledger-show', height: this.store.height, head: last, hash: this.store.headHash(), pending: this.pending.size,
        records: this.index.size, work, threshold: this.threshold,
      };
    }
    const block = this.store.at(height);
    if (!block) throw new InvalidArgumentError(`there is no block ${height}: the ledger has ${this.store.height}`);
    return {
      type: 'ledger-show', height: this.store.height, block: {
        header: block.header, hash: headerHash(block.header), signatures: block.signatures.map((s) => s.validator),
        records: block.records.map((r) => ({
          id: recordId(r), peer: r.peer, job: r.job, kind: r.kind, step: r.step, micro: r.micro, flops: r.flops ?? 0,
          ...(r.by ? { user: r.by.user } : {}),
        })),
      },
    };
  }

  private indexBlock(block: Block): void {
    for (const r of block.records) {
      const id = entryKey(r);
      const record = recordId(r);
      if (!this.index.has(record)) this.index.set(record, block.header.height);
      this.entries.add(id);
      this.pending.delete(id);
      for (const resolve of this.waiters.get(id) ?? []) resolve();
      this.waiters.delete(id);
    }
  }

  /** Appends the next block (checked by the store; `recordsChecked`: made here of records checked on submission), under the lock. */
  private append(block: Block, recordsChecked = false): void {
    this.store.append(block, recordsChecked);
    this.indexBlock(block);
  }

  /** Signs a peer's proposed block once it follows this ledger's head; catches up first when behind. */
  private async cosign(block: Block, from: string): Promise<Record<string, unknown>> {
    if (block.header.height > this.store.height) await this.catchUpFrom(from);
    return this.lock.run(async () => {
      const { height } = block.header;
      if (height < this.store.height) {
        const mine = this.store.at(height)!;
        if (headerHash(mine.header) !== headerHash(block.header)) {
          throw new InvalidMessageError(`block ${height} conflicts with this ledger's block ${height}`);
        }
      } else {
        const problem = blockProblem(block, this.store.head, { ...this.signers(), threshold: 0 });
        if (problem) throw new InvalidMessageError(`block refused: ${problem}`);
      }
      return { type: 'ledger-signed', signature: signHeader(block.header, this.signer) };
    });
  }

  private async catchUp(): Promise<void> {
    for (const [id, p] of this.peers) if (p.alive && (p.head?.height ?? 0) > this.store.height) await this.catchUpFrom(id);
  }

  /** Fetches the blocks a peer has past this ledger's head, one at a time, each checked before it is appended. */
  private async catchUpFrom(peer: string): Promise<void> {
    const target = this.peers.get(peer)?.target;
    if (!target) return;
    await this.lock.run(async () => {
      for (;;) {
        const blocks = parseBlocksAnswer(await request(this.node, target, { type: 'ledger-blocks', from: this.store.height }, PEER_TIMEOUT_MS));
        if (blocks.length === 0) return;
        this.append(blocks[0]);
        this.options.log.info('ledger-caught-up', { from: peer, height: this.store.height });
      }
    });
  }

  /** One round: peers' heads (catching up when behind), then a block from the leader, or pending records handed to it. */
  private async tick(): Promise<void> {
    if (this.ticking) return;
    this.ticking = true;
    try {
      await Promise.all([...this.peers].map(async ([id, p]) => {
        try {
          p.head = parseHead(await request(this.node, p.target, { type: 'ledger-head' }, PEER_TIMEOUT_MS));
          if (!p.alive) this.options.log.info('validator-back', { peer: id });
          p.alive = true;
        } catch {
          if (p.alive) this.options.log.warn('validator-down', { peer: id });
          p.alive = false;
        }
      }));
      await this.catchUp().catch((err: unknown) => this.options.log.warn('catch-up-failed', { error: (err as Error).message }));
      if (this.pending.size === 0) return;
      const self = this.node.peerId.toString();
      const alive = [...this.peers].filter(([, p]) => p.alive).map(([id]) => id);
      const leader = [self, ...alive].sort()[0];
      if (leader !== self) {
        await this.forward(leader);
        return;
      }
      // a backlog is made into blocks back to back, not one block per round
      for (let made = true; made && this.pending.size > 0;) made = await this.propose(alive);
    } catch (err) {
      this.options.log.warn('ledger-round-failed', { error: (err as Error).message });
    } finally {
      this.ticking = false;
    }
  }

  /** Hands the pending records to the leader (its answer comes once they are in a block, which reaches this ledger too). */
  private async forward(leader: string): Promise<void> {
    const records = [...this.pending.values()].slice(0, MAX_BLOCK_RECORDS);
    await request(this.node, this.peers.get(leader)!.target, { type: 'ledger-submit', records }, SUBMIT_TIMEOUT_MS);
  }

  /** Makes a block of pending records, has the live peers co-sign it, and appends it once the threshold is reached (false: it was not). */
  private async propose(alive: string[]): Promise<boolean> {
    const made = await this.lock.run(async () => {
      const records = [...this.pending.values()].slice(0, MAX_BLOCK_RECORDS);
      const block = makeBlock(this.store.head, records, Date.now());
      const answers = await Promise.all(alive.map(async (id) => {
        try {
          const a = await request(this.node, this.peers.get(id)!.target, { type: 'ledger-propose', block }, PEER_TIMEOUT_MS);
          const sig = (a.signature ?? {}) as Record<string, unknown>;
          return { validator: str(sig.validator, 'signature.validator', 128), sig: str(sig.sig, 'signature.sig', 200) };
        } catch (err) {
          this.options.log.warn('cosign-refused', { peer: id, error: (err as Error).message });
          return null;
        }
      }));
      const signatures = [signHeader(block.header, this.signer), ...answers.filter((a) => a !== null)];
      block.signatures = signatures.filter((s) => validSigners(block.header, [s], { ...this.signers(), threshold: 0 }).length === 1);
      if (block.signatures.length < this.threshold) {
        this.options.log.warn('block-short-of-signatures', { height: block.header.height, signatures: block.signatures.length, threshold: this.threshold });
        return null;
      }
      this.append(block, true);
      return block;
    });
    if (!made) return false;
    const block = made;
    await Promise.all(alive.map((id) => request(this.node, this.peers.get(id)!.target, { type: 'ledger-commit', block }, PEER_TIMEOUT_MS).catch(() => {})));
    return true;
  }
}
