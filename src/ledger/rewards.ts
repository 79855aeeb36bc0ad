import { InvalidArgumentError } from '../errors.ts';

/** A worker's standing in one epoch, from the ledger and the validators' reputation. */
export interface WorkerEpoch {
  account: string;
  /** FLOPs of its computations accepted into the epoch's blocks (rejected work counts nothing). */
  work: number;
  /** Its reputation in [0, 1] at the epoch's end; a flagged worker's is 0. */
  reputation: number;
}

/** A validator's part in one epoch: the blocks it co-signed. */
export interface ValidatorEpoch {
  account: string;
  blocks: number;
}

export interface EpochRewards {
  /** Token amounts (smallest unit) per account; accounts that earned nothing are left out. */
  rewards: Map<string, bigint>;
  /** What rounding left over: it goes into the next epoch's pool. */
  carry: bigint;
}

/** Reputation counts in millionths, so the arithmetic stays in integers. */
const PPM = 1_000_000n;
const BPS = 10_000n;

/**
 * The reward formula. An epoch pays `pool` tokens: validators take `validatorShareBps`
 * basis points of it, split by the blocks each co-signed; workers share the rest in
 * proportion to verified work times reputation,
 *
 *   reward(w) = ⌊ (pool − V) · work(w) · rep(w) / Σ work · rep ⌋,  V = ⌊ pool · share / 10⁴ ⌋.
 *
 * Every division rounds down; the remainder is carried to the next epoch. Amounts never sum
 * past the pool. With no worker (or no validator) earning, that part is carried.
 */
export function epochRewards(
  pool: bigint, validatorShareBps: number, workers: readonly WorkerEpoch[], validators: readonly ValidatorEpoch[],
): EpochRewards {
  if (pool < 0n) throw new InvalidArgumentError('the pool cannot be negative');
  if (!Number.isInteger(validatorShareBps) || validatorShareBps < 0 || validatorShareBps > 10_000) {
    throw new InvalidArgumentError(`the validators' share must be 0 to 10000 basis points, got ${validatorShareBps}`);
  }
  const rewards = new Map<string, bigint>();
  const add = (account: string, amount: bigint) => {
    if (amount > 0n) rewards.set(account, (rewards.get(account) ?? 0n) + amount);
  };
  const toValidators = (pool * BigInt(validatorShareBps)) / BPS;
  const toWorkers = pool - toValidators;
  let paid = 0n;

  const scores = workers.map((w) => {
    if (!Number.isFinite(w.work) || w.work < 0) throw new InvalidArgumentError(`${w.account}: work must be a non-negative number`);
    if (!Number.isFinite(w.reputation) || w.reputation < 0 || w.reputation > 1) {
      throw new InvalidArgumentError(`${w.account}: reputation must be in [0, 1]`);
    }
    return BigInt(Math.round(w.work)) * BigInt(Math.round(w.reputation * Number(PPM)));
  });
  const total = scores.reduce((a, b) => a + b, 0n);
  if (total > 0n) {
    workers.forEach((w, i) => {
      const r = (toWorkers * scores[i]) / total;
      add(w.account, r);
      paid += r;
    });
  }
  const blocks = validators.reduce((a, v) => a + BigInt(Math.max(0, Math.floor(v.blocks))), 0n);
  if (blocks > 0n) {
    for (const v of validators) {
      const r = (toValidators * BigInt(Math.max(0, Math.floor(v.blocks)))) / blocks;
      add(v.account, r);
      paid += r;
    }
  }
  return { rewards, carry: pool - paid };
}
