import type { Libp2p } from '@libp2p/interface';
import type { Address, Hex } from 'viem';
import type { NodeChain } from '../chain/index.ts';
import { type DialTarget, type Logger, request } from '../p2p/index.ts';

/** How often a worker looks for newly settled epochs. */
export const CLAIM_POLL_MS = 1_000;

/**
 * A worker's rewards: whenever the chain announces a settled epoch, the worker asks its
 * validator for its amount and Merkle proof and claims it (once; the contract refuses a
 * second claim). Epochs it earned nothing in are passed over.
 */
export class Claimer {
  private next = 0n;
  private timer: ReturnType<typeof setInterval> | null = null;
  private busy = false;
  /** What it has claimed so far in this run, by epoch. */
  readonly claimed = new Map<string, bigint>();

  constructor(
    private readonly node: Libp2p,
    private readonly validator: DialTarget,
    private readonly chain: NodeChain,
    private readonly log: Logger,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.poll(), CLAIM_POLL_MS);
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }

  private async poll(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      // when a claim fails (its validator unreachable, say) the next poll reads the same epochs again: claimed ones are passed over
      const settled = await this.chain.settledSince(this.next);
      for (const e of settled) await this.claim(e.epoch);
      if (settled.length > 0) this.next = settled.at(-1)!.block + 1n;
    } catch (err) {
      this.log.warn('claim-failed', { error: (err as Error).message });
    } finally {
      this.busy = false;
    }
  }

  private async claim(epoch: bigint): Promise<void> {
    const me = this.chain.address;
    let a: Record<string, unknown>;
    try {
      a = await request(this.node, this.validator, { type: 'ledger-reward', epoch: epoch.toString(), account: me });
    } catch (err) {
      // unreachable: tried again at the next poll; any other answer (an epoch its validator did not settle) will not change
      if ((err as Error).name === 'PeerUnreachableError') throw err;
      this.log.warn('reward-unavailable', { epoch: epoch.toString(), error: (err as Error).message });
      return;
    }
    const amount = BigInt(typeof a.amount === 'string' && /^[0-9]{1,78}$/.test(a.amount) ? a.amount : '0');
    if (amount === 0n) return;
    if (await this.chain.read<boolean>('settlement', 'claimed', [epoch, me])) return;
    const proof = (Array.isArray(a.proof) ? a.proof : []).filter((p): p is Hex => typeof p === 'string' && /^0x[0-9a-f]{64}$/i.test(p));
    await this.chain.write('settlement', 'claim', [epoch, me as Address, amount, proof]);
    this.claimed.set(epoch.toString(), amount);
    this.log.info('reward-claimed', { epoch: epoch.toString(), amount: amount.toString() });
  }
}
