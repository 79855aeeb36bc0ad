import { appendFileSync, existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { PeerId } from '@libp2p/interface';
import type { Address, Hex } from 'viem';
import { escrowKey, type EscrowHeld, MIN_STAKE, type NodeChain, PRICE_PER_FLOP, RewardTree, SLASH_BPS } from '../chain/index.ts';
import { InvalidArgumentError, InvalidMessageError, RateLimitedError } from '../errors.ts';
import { type EpochRecord, epochRewards, escrowJobOf, paidWork } from '../ledger/index.ts';
import { type Handler, type Logger, obj, parseAccount, request, str, type TensorLinkNode } from '../p2p/index.ts';
import { parseRecord, recordId, type Reputation, type WorkRecord } from '../verify/index.ts';
import type { LedgerService } from './ledger-service.ts';
import { Slots } from '../p2p/index.ts';

/** The validators' share of each epoch's pool, in basis points (the rest goes to workers). */
export const VALIDATOR_SHARE_BPS = 1_000;
/** How often a validator refreshes the stakes and claims that `status` shows. */
export const CHAIN_REFRESH_MS = 2_000;
/** How long closing an epoch waits at most for the records handed in to be put into blocks. */
export const SETTLE_WAIT_MS = 30_000;
/** How often a peer outside the validators' set may have an epoch closed (each close is a transaction on the chain). */
export const SETTLE_INTERVAL_MS = 10 * 60_000;

/** What an epoch's rewards follow from; the proposer sends it, co-signers recompute the rest from their own ledger and the chain. */
export interface EpochInput {
  epoch: string;
  /** Blocks [from, to) of the ledger. */
  from: number;
  to: number;
  /** Workers' reputations (peer id → [0, 1]) and accounts (peer id → address), as the proposer knows them. */
  reputations: Record<string, number>;
  accounts: Record<string, string>;
  /** Validators' accounts (peer id → address): their share follows the blocks they co-signed. */
  validators: Record<string, string>;
}

/** A settled epoch as a validator keeps it: enough to hand each account its proof. */
interface EpochEntry {
  epoch: string;
  from: number;
  to: number;
  root: Hex;
  rewards: [string, string][];
}

const EPOCHS_FILE = join('ledger', 'epochs.jsonl');

/**
 * The validator's side of the chain: closes epochs (each worker's verified FLOPs from the
 * ledger, times its reputation; the validators' share by blocks co-signed; paid from the
 * jobs' escrow at PRICE_PER_FLOP and whatever the pool already holds), has its peers co-sign
 * the settlement, posts it, and hands workers their claim proofs. Slashes a worker whose
 * record failed re-execution.
 */
export class Settler {
  private readonly epochs: EpochEntry[] = [];
  /** Epochs this validator co-signed but did not post: it can hand out their proofs once the chain holds their root. */
  private readonly cosigned = new Map<string, EpochEntry>();
  private readonly lock = new Slots(1);
  private readonly path: string | null;
  private readonly view = new Map<string, { stake: bigint; claimed: bigint }>();
  private timer: ReturnType<typeof setInterval> | null = null;
  /** When a peer outside the validators' set last asked this validator to close an epoch (0: not since it started). */
  private lastAskedAt = 0;
  private readonly slashed = new Set<string>();

  constructor(
    private readonly node: TensorLinkNode,
    private readonly ledger: LedgerService,
    private readonly reputation: Reputation,
    private readonly accountOf: (peer: string) => string | undefined,
    readonly chain: NodeChain,
    dataDir: string | undefined,
    private readonly log: Logger,
  ) {
    this.path = dataDir ? join(dataDir, EPOCHS_FILE) : null;
    if (this.path && existsSync(this.path)) {
      for (const line of readFileSync(this.path, 'utf8').split('\n')) if (line.trim()) this.epochs.push(JSON.parse(line) as EpochEntry);
    }
  }

  start(accounts: () => string[]): void {
    const refresh = async () => {
      for (const a of accounts()) if (!(await this.refresh(a))) return;
    };
    void refresh();
    this.timer = setInterval(() => void refresh(), CHAIN_REFRESH_MS);
  }

  /** Reads an account's stake and claims now (a worker just announced it: it may be given work as soon as it is staked). */
  async refresh(account: string): Promise<boolean> {
    try {
      const [stake, claimed] = await Promise.all([this.chain.stakeOf(account as Address), this.chain.claimedBy(account as Address)]);
      this.view.set(account.toLowerCase(), { stake, claimed });
      return true;
    } catch (err) {
      this.log.warn('chain-unreachable', { error: (err as Error).message });
      return false;
    }
  }

  /** Whether this account's stake has been read. */
  knows(account: string): boolean {
    return this.view.has(account.toLowerCase());
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }

  /** A worker's stake, earned and claimed amounts as last read (for `status`). */
  standing(account: string): { stake: string; earned: string; claimed: string } | null {
    const v = this.view.get(account.toLowerCase());
    if (!v) return null;
    const earned = this.epochs.reduce((sum, e) => sum + BigInt(e.rewards.find(([a]) => a.toLowerCase() === account.toLowerCase())?.[1] ?? '0'), 0n);
    return { stake: v.stake.toString(), earned: earned.toString(), claimed: v.claimed.toString() };
  }

  /** Whether a worker holds enough stake to be given work (unknown: not yet read, so not yet). */
  staked(account: string | undefined): boolean {
    const v = account ? this.view.get(account.toLowerCase()) : undefined;
    return v !== undefined && v.stake >= MIN_STAKE;
  }

  /** Whether `peer` is one of the validators' set (their requests are not rate limited). */
  private isValidator(peer: PeerId): boolean {
    try {
      this.ledger.validatorOf(peer);
      return true;
    } catch {
      return false;
    }
  }

  handlers(): Record<string, Handler> {
    return {
      // closing an epoch writes to the chain (gas): peers outside the validators' set may ask for one every
      // SETTLE_INTERVAL_MS at most, all of them together (the first at once); a request counts when it arrives, whether
      // its close then succeeds or not
      'ledger-settle': (_m, from: PeerId) => {
        if (!this.isValidator(from)) {
          const wait = this.lastAskedAt + SETTLE_INTERVAL_MS - Date.now();
          const ago = Math.round((Date.now() - this.lastAskedAt) / 1000);
          if (wait > 0) throw new RateLimitedError(`an epoch was asked for ${ago} s ago: ask again in ${Math.ceil(wait / 1000)} s`);
          this.lastAskedAt = Date.now();
        }
        return this.lock.run(() => this.settle());
      },
      'settle-sign': async (m, from: PeerId) => {
        this.ledger.validatorOf(from);
        const input = parseEpochInput(m.input);
        // the workers' accounts are the proposer's word: each must be the one the worker announced here, where it announced one
        for (const [peer, account] of Object.entries(input.accounts)) {
          const mine = this.accountOf(peer);
          if (mine && mine.toLowerCase() !== account.toLowerCase()) throw new InvalidMessageError(`${peer} announced ${mine} here, not ${account}`);
        }
        const { entry, digest } = await this.compute(input);
        this.cosigned.set(entry.epoch, entry);
        return { type: 'settle-signed', signature: await this.chain.signDigest(digest), account: this.chain.address, root: entry.root };
      },
      'slash-sign': async (m, from: PeerId) => {
        this.ledger.validatorOf(from);
        const record = parseRecord(m.record);
        const account = parseAccount(m.account, 'account');
        const amount = BigInt(str(m.amount, 'amount', 78));
        const nonce = BigInt(str(m.nonce, 'nonce', 78));
        const evidence = `0x${recordId(record)}` as Hex;
        if (this.accountOf(record.peer)?.toLowerCase() !== account.toLowerCase()) {
          throw new InvalidMessageError(`${account} is not the account ${record.peer} announced`);
        }
        const digest = await this.chain.read<Hex>('settlement', 'slashDigest', [account, amount, evidence, nonce]);
        return { type: 'slash-signed', signature: await this.chain.signDigest(digest), account: this.chain.address };
      },
      'ledger-reward': async (m) => {
        const epoch = str(m.epoch, 'epoch', 78);
        const account = parseAccount(m.account, 'account');
        let entry = this.epochs.find((e) => e.epoch === epoch);
        if (!entry) {
          const co = this.cosigned.get(epoch);
          if (co && (await this.chain.read<Hex>('settlement', 'rewardRoot', [BigInt(epoch)])) === co.root) entry = co;
        }
        if (!entry) throw new InvalidArgumentError(`epoch ${epoch} was not settled by this validator`);
        const tree = treeOf(entry);
        const amount = entry.rewards.find(([a]) => a.toLowerCase() === account.toLowerCase())?.[1] ?? '0';
        return { type: 'ledger-reward', epoch, amount, proof: tree.proof(account as Address) ?? [] };
      },
    };
  }

  /** Closes the epoch: blocks since the last one, posted with the validators' signatures. */
  private async settle(): Promise<Record<string, unknown>> {
    const from = this.epochs.at(-1)?.to ?? 0;
    // records handed in just before go into blocks first (a round or two; on a loaded machine longer): an epoch that
    // closed before them would leave work that was paid for out (up to SETTLE_WAIT_MS, while records keep coming)
    const until = Date.now() + SETTLE_WAIT_MS;
    while (this.ledger.pendingCount > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 150));
    const to = this.ledger.store.height;
    if (to === from) throw new InvalidArgumentError(`nothing to settle: no block since the last epoch (the ledger has ${to})`);
    let epoch = BigInt(this.epochs.length);
    while ((await this.chain.read<Hex>('settlement', 'rewardRoot', [epoch])) !== ZERO) epoch++;
    const work = this.ledger.work(from, to);
    const reputations: Record<string, number> = {};
    const accounts: Record<string, string> = {};
    for (const peer of work.keys()) {
      const s = this.reputation.standing(peer);
      reputations[peer] = s.excluded ? 0 : s.score;
      const a = this.accountOf(peer);
      if (a) accounts[peer] = a;
      else this.log.warn('worker-without-account', { peer });
    }
    const validators: Record<string, string> = { [this.node.peerId.toString()]: this.chain.address };
    for (const [id, p] of this.ledger.peers) if (p.head?.account) validators[id] = p.head.account;
    const input: EpochInput = { epoch: epoch.toString(), from, to, reputations, accounts, validators };
    const { entry, digest, jobs, amounts, total } = await this.compute(input);
    if (total === 0n) throw new InvalidArgumentError(`epoch ${epoch}: nothing was earned (no job paid into escrow, and the pool is empty)`);
    const signatures = [{ account: this.chain.address as string, signature: await this.chain.signDigest(digest) }];
    for (const [id, p] of this.ledger.peers) {
      if (!p.alive) continue;
      try {
        const a = await request(this.node, p.target, { type: 'settle-sign', input }, 30_000);
        signatures.push({ account: parseAccount(a.account, 'account'), signature: str(a.signature, 'signature', 200) as Hex });
      } catch (err) {
        this.log.warn('settle-sign-refused', { peer: id, error: (err as Error).message });
      }
    }
    // the contract counts signatures by ascending signer address
    signatures.sort((x, y) => (x.account.toLowerCase() < y.account.toLowerCase() ? -1 : 1));
    await this.chain.write('settlement', 'settle', [epoch, entry.root, total, jobs, amounts, signatures.map((s) => s.signature)]);
    this.epochs.push(entry);
    if (this.path) {
      mkdirSync(join(this.path, '..'), { recursive: true });
      appendFileSync(this.path, `${JSON.stringify(entry)}\n`);
    }
    this.log.info('epoch-settled', { epoch: entry.epoch, root: entry.root, total: total.toString() });
    return { type: 'ledger-settled', epoch: Number(epoch), root: entry.root, rewards: Object.fromEntries(entry.rewards), from, to };
  }

  /** The epoch's releases, pool, rewards and digest, from this validator's ledger and the chain. */
  private async compute(input: EpochInput) {
    if (input.to > this.ledger.store.height || input.from > input.to) {
      throw new InvalidArgumentError(`blocks [${input.from}, ${input.to}) are not all in this validator's ledger (it has ${this.ledger.store.height})`);
    }
    const records: EpochRecord[] = [];
    const signed = new Map<string, number>();
    for (let h = input.from; h < input.to; h++) {
      const block = this.ledger.store.at(h)!;
      for (const r of block.records) records.push({ peer: r.peer, job: escrowJobOf(r.job), user: r.by?.user, flops: r.flops ?? 0 });
      for (const s of block.signatures) signed.set(s.validator, (signed.get(s.validator) ?? 0) + 1);
    }
    // each job's escrow as bound to the user who accepted its records (a hosted span's records: the user's escrow for
    // the model): only that user's records are paid from it, and none of a worker's work for a job it runs or paid for
    // itself (see paidWork)
    const escrows = new Map<string, EscrowHeld>();
    const pairs = new Map(records.flatMap((r) => (r.user === undefined ? [] : [[`${r.job}\n${r.user}`, { job: r.job, user: r.user }] as const])));
    await Promise.all([...pairs].map(async ([k, { job, user }]) => escrows.set(k, await this.chain.escrowOf(job, user))));
    const paid = paidWork(records, (job, user) => {
      const e = escrows.get(`${job}\n${user}`);
      return e && { payer: e.payer, held: e.amount };
    }, (peer) => input.accounts[peer], PRICE_PER_FLOP);
    const jobs = paid.releases.map((r) => escrowKey(r.job, r.user));
    const amounts = paid.releases.map((r) => r.amount);
    const work = paid.work;
    const [balance, owed] = await Promise.all([
      this.chain.balanceOf(this.chain.deployment.contracts.settlement), this.chain.read<bigint>('settlement', 'owed'),
    ]);
    const pool = balance - owed + amounts.reduce((a, b) => a + b, 0n);
    const workers = [...work].filter(([peer]) => input.accounts[peer]).map(([peer, flops]) => ({
      account: input.accounts[peer], work: flops, reputation: Math.min(1, Math.max(0, input.reputations[peer] ?? 0)),
    }));
    const validators = Object.entries(input.validators).map(([peer, account]) => ({ account, blocks: signed.get(peer) ?? 0 }));
    const { rewards } = epochRewards(pool, VALIDATOR_SHARE_BPS, workers, validators);
    const sorted: [string, string][] = [...rewards]
      .sort(([a], [b]) => a.toLowerCase().localeCompare(b.toLowerCase()))
      .map(([a, v]) => [a, v.toString()]);
    const entry: EpochEntry = { epoch: input.epoch, from: input.from, to: input.to, root: ZERO, rewards: sorted };
    const tree = treeOf(entry);
    entry.root = tree.root;
    const digest = await this.chain.read<Hex>('settlement', 'settleDigest', [BigInt(input.epoch), tree.root, tree.total, jobs, amounts]);
    return { entry, digest, jobs, amounts, total: tree.total };
  }

  /** Cuts SLASH_BPS of a worker's stake for a record whose re-execution failed (the record's id is the evidence). */
  slash(record: WorkRecord): Promise<void> {
    // one cut per worker: a cheater caught is excluded from then on, and further failed re-runs of its work are the same offence
    if (this.slashed.has(record.peer)) return Promise.resolve();
    this.slashed.add(record.peer);
    return this.lock.run(async () => {
      const account = this.accountOf(record.peer) as Address | undefined;
      if (!account) {
        this.log.warn('slash-without-account', { peer: record.peer });
        return;
      }
      const stake = await this.chain.stakeOf(account);
      const amount = (stake * SLASH_BPS) / 10_000n;
      if (amount === 0n) return;
      const evidence = `0x${recordId(record)}` as Hex;
      const nonce = await this.chain.read<bigint>('settlement', 'slashNonce');
      const digest = await this.chain.read<Hex>('settlement', 'slashDigest', [account, amount, evidence, nonce]);
      const signatures = [{ account: this.chain.address as string, signature: await this.chain.signDigest(digest) }];
      for (const [id, p] of this.ledger.peers) {
        if (!p.alive) continue;
        try {
          const a = await request(this.node, p.target, {
            type: 'slash-sign', record, account, amount: amount.toString(), nonce: nonce.toString(),
          }, 30_000);
          signatures.push({ account: parseAccount(a.account, 'account'), signature: str(a.signature, 'signature', 200) as Hex });
        } catch (err) {
          this.log.warn('slash-sign-refused', { peer: id, error: (err as Error).message });
        }
      }
      signatures.sort((x, y) => (x.account.toLowerCase() < y.account.toLowerCase() ? -1 : 1));
      await this.chain.write('settlement', 'slash', [account, amount, evidence, signatures.map((s) => s.signature)]);
      this.log.warn('worker-slashed', { peer: record.peer, account, amount: amount.toString(), evidence });
    });
  }
}

const ZERO = `0x${'0'.repeat(64)}` as Hex;

function treeOf(entry: EpochEntry): RewardTree {
  return new RewardTree(new Map(entry.rewards.map(([a, v]) => [a as Address, BigInt(v)])));
}

function parseEpochInput(v: unknown): EpochInput {
  const m = obj(v, 'input');
  const table = (x: unknown, what: string) => obj(x, what) as Record<string, unknown>;
  const accounts = Object.fromEntries(Object.entries(table(m.accounts, 'accounts')).map(([k, a]) => [k, parseAccount(a, `accounts.${k}`)]));
  const validators = Object.fromEntries(Object.entries(table(m.validators, 'validators')).map(([k, a]) => [k, parseAccount(a, `validators.${k}`)]));
  const reputations = Object.fromEntries(Object.entries(table(m.reputations, 'reputations')).map(([k, r]) => {
    if (typeof r !== 'number' || !(r >= 0 && r <= 1)) throw new InvalidMessageError(`reputations.${k} must be a number in [0, 1]`);
    return [k, r];
  }));
  const int = (x: unknown, what: string) => {
    if (!Number.isSafeInteger(x) || (x as number) < 0) throw new InvalidMessageError(`${what} must be a non-negative integer`);
    return x as number;
  };
  const epoch = str(m.epoch, 'epoch', 78);
  if (!/^[0-9]+$/.test(epoch)) throw new InvalidMessageError('epoch must be decimal digits');
  return { epoch, from: int(m.from, 'from'), to: int(m.to, 'to'), reputations, accounts, validators };
}
