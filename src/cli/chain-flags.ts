import { homedir } from 'node:os';
import { join } from 'node:path';
import type { NodeChain } from '../chain/index.ts';
import { ChainError } from '../errors.ts';
import { type Flags, stringFlag, UsageError } from './args.ts';
import type { Output } from './output.ts';

/** Where a user's Ethereum key is kept when it pays for jobs (a user has no --data directory). */
export const USER_KEY_DIR = join(homedir(), '.tensorlink', 'user');

/**
 * With `--contracts`: deposits `--pay` tokens (default 10 TLK) from the user's account into the
 * escrow of `job.jobId` bound to `job.user` (the peer id of the user's node, which accepts the
 * job's records and hands them to the ledger), which the validators release against the work
 * that user accepted.
 */
export async function payForJob(flags: Flags, job: { jobId: string; user: string }, out: Output): Promise<void> {
  const chain = await chainFromFlags(flags, USER_KEY_DIR);
  if (!chain) return;
  const raw = stringFlag(flags, 'pay') ?? '10';
  if (!/^[0-9]+(\.[0-9]{1,18})?$/.test(raw)) throw new UsageError(`--pay must be an amount of TLK (e.g. 10 or 2.5), got '${raw}'`);
  const { parseEther } = await import('viem');
  const amount = parseEther(raw);
  const balance = await chain.balanceOf();
  if (balance < amount) {
    throw new ChainError(`your account ${chain.address} (key in ${USER_KEY_DIR}) holds ${balance} token units; --pay needs ${amount}: fund it first`);
  }
  await chain.deposit(job.jobId, job.user, amount);
  out.info(`paid ${raw} TLK into escrow for job ${job.jobId} (run by ${job.user}) from ${chain.address}`);
}

/**
 * The chain a node joins (`--contracts FILE`, as `tensorlink chain --out FILE` wrote it, on
 * `--rpc URL` if given) with the account kept under `dataDir`; undefined without a chain.
 */
export async function chainFromFlags(flags: Flags, dataDir: string | undefined): Promise<NodeChain | undefined> {
  const contracts = stringFlag(flags, 'contracts');
  const rpc = stringFlag(flags, 'rpc');
  if (!contracts) {
    if (rpc) throw new UsageError('--rpc needs --contracts FILE (what `tensorlink chain --out FILE` wrote)');
    return undefined;
  }
  if (rpc !== undefined && !/^https?:\/\//.test(rpc)) throw new UsageError(`--rpc '${rpc}' is not an http(s) URL`);
  // the chain client (viem) loads only for a node that joins a chain
  const { NodeChain } = await import('../chain/index.ts');
  return NodeChain.open(contracts, { rpc, dataDir });
}
