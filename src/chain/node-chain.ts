import { type Abi, type Address, encodeAbiParameters, formatEther, type Hex, keccak256, type LocalAccount, stringToBytes } from 'viem';
import { ChainError } from '../errors.ts';
import { loadOrCreateAccount } from './account.ts';
import { type Deployment, readDeployment } from './contracts-file.ts';
import { artifacts, type ChainClients, clients } from './deploy.ts';

import { MIN_STAKE } from './constants.ts';

export { MIN_STAKE, PRICE_PER_FLOP, SLASH_BPS } from './constants.ts';

/** A job's id on the chain: keccak256 of its id's UTF-8 bytes. */
export function jobKey(jobId: string): Hex {
  return keccak256(stringToBytes(jobId));
}

/** A user's id on the chain: keccak256 of its peer id's UTF-8 bytes. */
export function userKey(peerId: string): Hex {
  return keccak256(stringToBytes(peerId));
}

/**
 * The key of the escrow of job `jobId` run by the user `user` (a peer id), as `Escrow.keyOf`
 * computes it: only records that user accepted are paid from it.
 */
export function escrowKey(jobId: string, user: string): Hex {
  return keccak256(encodeAbiParameters([{ type: 'bytes32' }, { type: 'bytes32' }], [jobKey(jobId), userKey(user)]));
}

/** A job's escrow as the chain holds it: who paid (the zero address: nobody) and what is left. */
export interface EscrowHeld {
  payer: Address;
  amount: bigint;
}

/** A settled epoch as the chain announced it. */
export interface SettledEpoch {
  epoch: bigint;
  root: Hex;
  total: bigint;
  block: bigint;
}

/**
 * A node's view of the chain: its own account (kept under its data directory), the
 * deployment it was pointed at (`--contracts FILE`, optionally on another `--rpc`), and the
 * calls a worker, a validator or a user makes. Every failure is a ChainError naming the call.
 */
export class NodeChain {
  readonly clients: ChainClients;
  private readonly abi: Record<string, Abi>;
  /** The transaction last sent from this account (settled or not): the next waits for it. */
  private writes: Promise<unknown> = Promise.resolve();

  constructor(
    readonly deployment: Deployment,
    readonly account: LocalAccount,
  ) {
    this.clients = clients(deployment.rpc, deployment.chainId);
    this.abi = Object.fromEntries(Object.entries(artifacts()).map(([n, a]) => [n, a.abi as Abi]));
  }

  /** Joins the deployment in `contractsFile` (on `rpc` if given) with the account kept in `dataDir`. */
  static open(contractsFile: string, options: { rpc?: string; dataDir?: string } = {}): NodeChain {
    const d = readDeployment(contractsFile);
    return new NodeChain({ ...d, rpc: options.rpc ?? d.rpc }, loadOrCreateAccount(options.dataDir));
  }

  get address(): Address {
    return this.account.address;
  }

  private contract(name: 'token' | 'staking' | 'escrow' | 'settlement'): { address: Address; abi: Abi } {
    const art = { token: 'TensorLinkToken', staking: 'Staking', escrow: 'Escrow', settlement: 'Settlement' }[name];
    return { address: this.deployment.contracts[name], abi: this.abi[art] };
  }

  async read<T>(name: 'token' | 'staking' | 'escrow' | 'settlement', functionName: string, args: unknown[] = []): Promise<T> {
    try {
      return (await this.clients.publicClient.readContract({ ...this.contract(name), functionName, args })) as T;
    } catch (cause) {
      throw new ChainError(`reading ${name}.${functionName} on ${this.deployment.rpc} failed: ${firstLine(cause)}`, { cause });
    }
  }

  /** Sends a transaction from this node's account and waits for it to be mined (a revert is a ChainError with its reason). */
  write(name: 'token' | 'staking' | 'escrow' | 'settlement', functionName: string, args: unknown[]): Promise<Hex> {
    return this.transact(`${name}.${functionName}`, async (wallet) => {
      const call = { ...this.contract(name), functionName, args, account: this.account };
      const { request } = await this.clients.publicClient.simulateContract(call);
      return wallet.writeContract(request);
    });
  }

  /**
   * Sends what `send` sends from this account, waits for it to be mined, and names `what` in
   * its ChainError. One at a time: a worker's stake and its claims come from the same account,
   * and two transactions sent together could take the same nonce.
   */
  private transact(what: string, send: (wallet: ReturnType<ChainClients['wallet']>) => Promise<Hex>): Promise<Hex> {
    const sent = this.writes.then(async () => {
      try {
        const hash = await send(this.clients.wallet(this.account));
        const receipt = await this.clients.publicClient.waitForTransactionReceipt({ hash });
        if (receipt.status !== 'success') throw new Error(`transaction ${hash} reverted`);
        return hash;
      } catch (cause) {
        throw new ChainError(`${what} from ${this.address} failed: ${firstLine(cause)}`, { cause });
      }
    });
    this.writes = sent.catch(() => undefined);
    return sent;
  }

  balanceOf(account: Address = this.address): Promise<bigint> {
    return this.read<bigint>('token', 'balanceOf', [account]);
  }

  stakeOf(account: Address = this.address): Promise<bigint> {
    return this.read<bigint>('staking', 'stakeOf', [account]);
  }

  /** This account's ether: what pays its transactions' gas. */
  async gasOf(account: Address = this.address): Promise<bigint> {
    try {
      return await this.clients.publicClient.getBalance({ address: account });
    } catch (cause) {
      throw new ChainError(`reading the balance of ${account} on ${this.deployment.rpc} failed: ${firstLine(cause)}`, { cause });
    }
  }

  /**
   * Locks `amount` more of this account's tokens as stake (an operator's `tensorlink stake`);
   * the stake after. An account without the tokens or the gas is a ChainError that says so.
   */
  async stake(amount: bigint): Promise<bigint> {
    const [balance, gas] = [await this.balanceOf(), await this.gasOf()];
    if (balance < amount) {
      const lack = `${this.address} holds ${formatEther(balance)} TLK, less than the ${formatEther(amount)} TLK to stake`;
      throw new ChainError(`${lack}: send it tokens first (tensorlink fund ${this.address})`);
    }
    if (gas === 0n) throw new ChainError(`${this.address} has no ether to pay for gas: send it some first (tensorlink fund ${this.address})`);
    await this.write('token', 'approve', [this.deployment.contracts.staking, amount]);
    await this.write('staking', 'stake', [amount]);
    return this.stakeOf();
  }

  /** Sends `tokens` TLK units and `gas` wei from this account to `to` (an operator funding its workers). */
  async fund(to: Address, tokens: bigint, gas: bigint): Promise<void> {
    if (gas > 0n) {
      await this.transact(`sending ${formatEther(gas)} ether to ${to}`, (wallet) => wallet.sendTransaction({ to, value: gas, account: this.account, chain: this.clients.chain }));
    }
    if (tokens > 0n) await this.write('token', 'transfer', [to, tokens]);
  }

  /** Locks stake up to MIN_STAKE from this account's tokens (what it has, if less); the stake after. */
  async ensureStake(min = MIN_STAKE): Promise<bigint> {
    const stake = await this.stakeOf();
    if (stake >= min) return stake;
    const balance = await this.balanceOf();
    const add = min - stake < balance ? min - stake : balance;
    if (add === 0n) return stake;
    await this.write('token', 'approve', [this.deployment.contracts.staking, add]);
    await this.write('staking', 'stake', [add]);
    return stake + add;
  }

  /**
   * Deposits `amount` into the escrow of `jobId` run by `user` (the peer id of the user's node,
   * the one that accepts the job's records and hands them to the ledger): what the records that
   * user accepted are paid from. This account becomes the escrow's payer.
   */
  async deposit(jobId: string, user: string, amount: bigint): Promise<void> {
    await this.write('token', 'approve', [this.deployment.contracts.escrow, amount]);
    await this.write('escrow', 'deposit', [jobKey(jobId), userKey(user), amount]);
  }

  /** The escrow of `jobId` run by `user`: its payer and what is left in it. */
  async escrowOf(jobId: string, user: string): Promise<EscrowHeld> {
    const job = await this.read<readonly [Address, bigint, bigint]>('escrow', 'jobs', [escrowKey(jobId, user)]);
    return { payer: job[0], amount: job[1] };
  }

  /** Signs a digest as the settlement contract checks it (EIP-191 over the 32 bytes). */
  signDigest(digest: Hex): Promise<Hex> {
    return this.account.signMessage({ message: { raw: digest } });
  }

  /** The epochs settled in chain blocks [fromBlock, latest]. */
  async settledSince(fromBlock: bigint): Promise<SettledEpoch[]> {
    try {
      const logs = await this.clients.publicClient.getContractEvents({ ...this.contract('settlement'), eventName: 'Settled', fromBlock, toBlock: 'latest' });
      return logs.map((l) => {
        const a = (l as unknown as { args: { epoch: bigint; root: Hex; total: bigint } }).args;
        return { epoch: a.epoch, root: a.root, total: a.total, block: l.blockNumber ?? 0n };
      });
    } catch (cause) {
      throw new ChainError(`reading the settlement's epochs on ${this.deployment.rpc} failed: ${firstLine(cause)}`, { cause });
    }
  }

  /** What `account` has claimed in all: the sum of its Claimed events. */
  async claimedBy(account: Address): Promise<bigint> {
    try {
      const logs = await this.clients.publicClient.getContractEvents({ ...this.contract('settlement'), eventName: 'Claimed', args: { account }, fromBlock: 0n });
      return logs.reduce((sum, l) => sum + (l as unknown as { args: { amount: bigint } }).args.amount, 0n);
    } catch (cause) {
      throw new ChainError(`reading claims on ${this.deployment.rpc} failed: ${firstLine(cause)}`, { cause });
    }
  }
}

/** viem's messages run to many lines (the call, the docs link): the first says what went wrong. */
function firstLine(err: unknown): string {
  const e = err as { shortMessage?: string; message?: string };
  return (e.shortMessage ?? e.message ?? String(err)).split('\n')[0];
}
