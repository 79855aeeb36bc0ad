import { existsSync } from 'node:fs';
import { type Address, isAddress } from 'viem';
import { mnemonicToAccount, privateKeyToAccount } from 'viem/accounts';
import {
  ANVIL_MNEMONIC, type Deployment, deployContracts, deployed, type LocalChain, readDeployment, startAnvil, writeDeployment,
} from '../../chain/index.ts';
import { ChainError } from '../../errors.ts';
import { type Flags, intFlag, stringFlag, UsageError } from '../args.ts';
import type { Output } from '../output.ts';
import { runUntilSignal } from './node-process.ts';

/** The token's supply: 10⁹ tokens of 18 decimals, all minted to the deployer. */
const SUPPLY = 10n ** 27n;
const UNSTAKE_DELAY_S = 3600;
const REFUND_AFTER_S = 7 * 86_400;

/**
 * `tensorlink chain`: without `--rpc`, starts anvil on a free loopback port (and keeps it until
 * Ctrl-C); deploys the token, staking, escrow and settlement contracts, or finds them already
 * deployed where `--out FILE` says, prints the ready line and writes the deployment to FILE.
 */
export async function chainCommand(flags: Flags, out: Output): Promise<void> {
  const rpcFlag = stringFlag(flags, 'rpc');
  const file = stringFlag(flags, 'out');
  const validators = (stringFlag(flags, 'validators') ?? mnemonicToAccount(ANVIL_MNEMONIC, { addressIndex: 1 }).address).split(',').map((a) => a.trim());
  for (const v of validators) if (!isAddress(v)) throw new UsageError(`--validators: '${v}' is not an address (0x and 40 hex digits)`);
  const threshold = intFlag(flags, 'threshold', Math.floor(validators.length / 2) + 1);
  if (threshold > validators.length) throw new UsageError(`--threshold ${threshold} is more than the ${validators.length} validators`);
  const keyText = stringFlag(flags, 'key') ?? process.env.TENSORLINK_DEPLOYER_KEY;
  if (keyText !== undefined && !/^0x[0-9a-fA-F]{64}$/.test(keyText)) throw new UsageError('--key must be a private key: 0x and 64 hex digits');
  // a local chain's deployer is its first funded account; another chain's is the key given
  const deployer = keyText ? privateKeyToAccount(keyText as `0x${string}`) : mnemonicToAccount(ANVIL_MNEMONIC, { addressIndex: 0 });

  let local: LocalChain | null = null;
  let rpc = rpcFlag;
  let chainId: number;
  if (!rpc) {
    local = await startAnvil();
    rpc = local.rpc;
    chainId = local.chainId;
  } else chainId = await chainIdOf(rpc);
  try {
    let deployment: Deployment | null = null;
    if (file && existsSync(file)) {
      const found = readDeployment(file);
      if (found.chainId === chainId && (await deployed(rpc, chainId, found.contracts))) deployment = { ...found, rpc };
    }
    const fresh = deployment === null;
    deployment ??= { rpc, chainId, contracts: await deployContracts(rpc, chainId, deployer, {
      supply: SUPPLY, validators: validators as Address[], threshold, unstakeDelay: UNSTAKE_DELAY_S, refundAfter: REFUND_AFTER_S,
    }) };
    if (file) writeDeployment(file, deployment);
    process.stdout.write(`${JSON.stringify({ event: 'ready', rpc, chainId, contracts: deployment.contracts })}\n`);
    out.info(`${fresh ? 'deployed' : 'found'} the contracts on ${rpc} (chain ${chainId})${file ? `; written to ${file}` : ''}`);
    for (const [name, address] of Object.entries(deployment.contracts)) out.info(`  ${name.padEnd(10)} ${address}`);
  } catch (err) {
    await local?.stop();
    throw err;
  }
  if (local) {
    out.info('anvil runs until Ctrl-C');
    await runUntilSignal(local.stop, flags);
  }
}

async function chainIdOf(rpc: string): Promise<number> {
  let answer: unknown;
  try {
    const res = await fetch(rpc, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_chainId', params: [] }) });
    answer = await res.json();
  } catch (cause) {
    throw new ChainError(`cannot reach the Ethereum JSON-RPC endpoint ${rpc}: ${(cause as Error).message}`, { cause });
  }
  const hex = (answer as { result?: unknown }).result;
  if (typeof hex !== 'string') throw new ChainError(`${rpc} did not answer eth_chainId`);
  return Number.parseInt(hex, 16);
}
