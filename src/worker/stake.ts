import { MIN_STAKE } from '../chain/constants.ts';
import type { NodeChain } from '../chain/index.ts';
import type { Logger } from '../p2p/index.ts';

/**
 * A worker's stake, kept up: each check (the worker's start, then every announcement) reads
 * its stake and, below MIN_STAKE, locks what its tokens allow. A worker an operator funds
 * after it started stakes at its next announcement. A stake that fell since the last check was
 * slashed: the worker does not buy its way back in this run (its operator may, with `tensorlink
 * stake`). One check at a time; the log says when the standing changes.
 */
export class StakeKeeper {
  private checking: Promise<bigint | null> | null = null;
  private staked: boolean | null = null;
  /** The stake the last check saw. */
  private last: bigint | null = null;
  private slashed = false;

  constructor(
    private readonly chain: NodeChain,
    private readonly log: Logger,
  ) {}

  /** Checks (or joins the check under way); the stake after it, null when the chain could not be read. */
  check(): Promise<bigint | null> {
    this.checking ??= this.topUp()
      .then((stake) => {
        this.report(stake);
        return stake;
      })
      .catch((err: Error) => {
        this.log.warn('stake-check-failed', { account: this.chain.address, error: err.message });
        return null;
      })
      .finally(() => {
        this.checking = null;
      });
    return this.checking;
  }

  private async topUp(): Promise<bigint> {
    const now = await this.chain.stakeOf();
    if (!this.slashed && this.last !== null && now < this.last) {
      this.slashed = true;
      this.log.warn('slashed', { account: this.chain.address, stake: now.toString(), was: this.last.toString() });
    }
    const stake = this.slashed || now >= MIN_STAKE ? now : await this.chain.ensureStake();
    this.last = stake;
    return stake;
  }

  private report(stake: bigint): void {
    const staked = stake >= MIN_STAKE;
    if (staked === this.staked) return;
    this.staked = staked;
    if (staked) this.log.info('staked', { account: this.chain.address, stake: stake.toString() });
    else {
      this.log.warn('not-staked', {
        account: this.chain.address, stake: stake.toString(), needed: MIN_STAKE.toString(),
        fix: 'send this account tokens (and gas); it stakes at its next announcement',
      });
    }
  }
}
