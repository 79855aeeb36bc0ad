import {
  type Account, type Address, type Chain, createPublicClient, createWalletClient, defineChain, type Hex, http, type PublicClient,
  type Transport, type WalletClient,
} from 'viem';
import { artifacts } from './artifacts.ts';
import type { Artifact } from './compile.ts';

export { artifacts };

/** The contracts of a deployment, by name. */
export interface Contracts {
  token: Address;
  staking: Address;
  escrow: Address;
  settlement: Address;
}

/** A chain reached over JSON-RPC: a client for reading, and wallets for accounts to send from. */
export interface ChainClients {
  chain: Chain;
  publicClient: PublicClient<Transport, Chain>;
  wallet: (account: Account) => WalletClient<Transport, Chain, Account>;
}

export function clients(rpc: string, chainId: number): ChainClients {
  const chain: Chain = defineChain({ id: chainId, name: `chain ${chainId}`, nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 }, rpcUrls: { default: { http: [rpc] } } });
  const transport = http(rpc, { retryCount: 0 });
  const publicClient = createPublicClient({ chain, transport }) as PublicClient<Transport, Chain>;
  const wallet = (account: Account) => createWalletClient({ account, chain, transport }) as WalletClient<Transport, Chain, Account>;
  return { chain, publicClient, wallet };
}

export interface DeployOptions {
  /** The token's supply, all of it minted to the deployer. */
  supply: bigint;
  validators: Address[];
  threshold: number;
  /** Seconds an unstake waits. */
  unstakeDelay: number;
  /** Seconds after which a job's unreleased deposit may go back to its payer. */
  refundAfter: number;
}

async function deployOne(c: ChainClients, from: WalletClient<Transport, Chain, Account>, a: Artifact, args: unknown[]): Promise<Address> {
  const hash = await from.deployContract({ abi: a.abi, bytecode: a.bytecode, args });
  const receipt = await c.publicClient.waitForTransactionReceipt({ hash });
  if (!receipt.contractAddress) throw new Error(`deploying failed: ${hash}`);
  return receipt.contractAddress;
}

/** Deploys the token, settlement, staking and escrow, and wires them together. */
export async function deployContracts(rpc: string, chainId: number, deployer: Account, o: DeployOptions): Promise<Contracts> {
  const c = clients(rpc, chainId);
  const from = c.wallet(deployer);
  const art = artifacts();
  const token = await deployOne(c, from, art.TensorLinkToken, [o.supply]);
  const settlement = await deployOne(c, from, art.Settlement, [token, o.validators, BigInt(o.threshold)]);
  const staking = await deployOne(c, from, art.Staking, [token, settlement, BigInt(o.unstakeDelay)]);
  const escrow = await deployOne(c, from, art.Escrow, [token, settlement, BigInt(o.refundAfter)]);
  const hash: Hex = await from.writeContract({ address: settlement, abi: art.Settlement.abi, functionName: 'wire', args: [staking, escrow] });
  await c.publicClient.waitForTransactionReceipt({ hash });
  return { token, staking, escrow, settlement };
}

/** Whether every contract of `contracts` has code on the chain (a deployment found again). */
export async function deployed(rpc: string, chainId: number, contracts: Contracts): Promise<boolean> {
  const c = clients(rpc, chainId);
  const codes = await Promise.all(Object.values(contracts).map((address: Address) => c.publicClient.getCode({ address })));
  return codes.every((code) => code !== undefined && code !== '0x');
}
