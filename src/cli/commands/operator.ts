import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { type Address, formatEther, isAddress, parseEther } from 'viem';
import { mnemonicToAccount, privateKeyToAccount } from 'viem/accounts';
import { ACCOUNT_FILE, ANVIL_MNEMONIC, loadOrCreateAccount, MIN_STAKE, NodeChain, readDeployment } from '../../chain/index.ts';
import { type Flags, requiredString, stringFlag, UsageError } from '../args.ts';
import { chainFromFlags } from '../chain-flags.ts';
import type { Output } from '../output.ts';

/** The chain id anvil runs under unless told otherwise: its first account deployed `tensorlink chain`'s contracts. */
const ANVIL_CHAIN_ID = 31337;

/** An amount of TLK (or ether) as a person writes it: 100, 2.5. */
function tokens(flags: Flags, name: string, fallback: bigint): bigint {
  const raw = stringFlag(flags, name);
  if (raw === undefined) return fallback;
  if (!/^[0-9]+(\.[0-9]{1,18})?$/.test(raw)) throw new UsageError(`--${name} must be an amount such as 100 or 2.5, got '${raw}'`);
  return parseEther(raw);
}

/**
 * `tensorlink account --data DIR`: the Ethereum account a node started with `--data DIR` will
 * use (its key is created there now if it is not yet), so that an operator can name it in
 * `chain --validators` or fund it before the node first runs. With `--contracts`, also its
 * ether, tokens and stake on that chain.
 */
export async function accountCommand(flags: Flags, out: Output): Promise<void> {
  const data = requiredString(flags, 'data');
  const created = !existsSync(join(data, ACCOUNT_FILE));
  const account = loadOrCreateAccount(data).address;
  const chain = await chainFromFlags(flags, data);
  const held = chain
    ? { gas: formatEther(await chain.gasOf()), tokens: formatEther(await chain.balanceOf()), stake: formatEther(await chain.stakeOf()) }
    : null;
  out.info(`${created ? 'created' : 'found'} the key of ${account} in ${join(data, ACCOUNT_FILE)}`);
  const human = held ? `${account}\n  ether ${held.gas}, tokens ${held.tokens} TLK, staked ${held.stake} TLK` : account;
  out.result({ account, data, created, ...(held ?? {}) }, human);
}

/**
 * `tensorlink stake [--amount N] --data DIR --contracts FILE [--rpc URL]`: locks N TLK (default:
 * what is missing up to the 100 TLK a worker needs) of the account under DIR as stake.
 */
export async function stakeCommand(flags: Flags, out: Output): Promise<void> {
  const data = requiredString(flags, 'data');
  const chain = await chainFromFlags(flags, data);
  if (!chain) throw new UsageError('stake needs --contracts FILE (what `tensorlink chain --out FILE` wrote)');
  const before = await chain.stakeOf();
  const amount = tokens(flags, 'amount', before >= MIN_STAKE ? 0n : MIN_STAKE - before);
  if (amount === 0n) {
    out.result({ account: chain.address, staked: '0', stake: formatEther(before) }, `${chain.address} already stakes ${formatEther(before)} TLK (a worker needs ${formatEther(MIN_STAKE)})`);
    return;
  }
  const after = await chain.stake(amount);
  out.result(
    { account: chain.address, staked: formatEther(amount), stake: formatEther(after) },
    `${chain.address} staked ${formatEther(amount)} TLK: ${formatEther(after)} TLK in all${after < MIN_STAKE ? ` (a worker needs ${formatEther(MIN_STAKE)})` : ''}`,
  );
}

/**
 * `tensorlink fund ADDRESS... [--amount N] [--gas N] --contracts FILE [--rpc URL] [--key 0xKEY]`:
 * sends each account N TLK (default 1000) and N ether for gas (default 1) from the key given (or
 * TENSORLINK_DEPLOYER_KEY; on anvil, by default its first account, which deployed the contracts
 * and holds the supply).
 */
export async function fundCommand(flags: Flags, out: Output, positionals: string[]): Promise<void> {
  if (positionals.length === 0) throw new UsageError('fund needs the accounts to fund: tensorlink fund 0xADDRESS... --contracts FILE');
  for (const a of positionals) if (!isAddress(a)) throw new UsageError(`'${a}' is not an address (0x and 40 hex digits): tensorlink account --data DIR prints a node's`);
  const file = requiredString(flags, 'contracts');
  const rpc = stringFlag(flags, 'rpc');
  if (rpc !== undefined && !/^https?:\/\//.test(rpc)) throw new UsageError(`--rpc '${rpc}' is not an http(s) URL`);
  const deployment = readDeployment(file);
  const keyText = stringFlag(flags, 'key') ?? process.env.TENSORLINK_DEPLOYER_KEY;
  if (keyText !== undefined && !/^0x[0-9a-fA-F]{64}$/.test(keyText)) throw new UsageError('--key must be a private key: 0x and 64 hex digits');
  if (keyText === undefined && deployment.chainId !== ANVIL_CHAIN_ID) {
    throw new UsageError(`chain ${deployment.chainId} is not anvil's: give the key that holds the tokens (--key 0xKEY or TENSORLINK_DEPLOYER_KEY)`);
  }
  const from = keyText ? privateKeyToAccount(keyText as `0x${string}`) : mnemonicToAccount(ANVIL_MNEMONIC, { addressIndex: 0 });
  const bank = new NodeChain({ ...deployment, rpc: rpc ?? deployment.rpc }, from);
  const amount = tokens(flags, 'amount', parseEther('1000'));
  const gas = tokens(flags, 'gas', parseEther('1'));
  for (const to of positionals as Address[]) {
    await bank.fund(to, amount, gas);
    out.info(`sent ${formatEther(amount)} TLK and ${formatEther(gas)} ether from ${bank.address} to ${to}`);
  }
  out.result({ from: bank.address, accounts: positionals, tokens: formatEther(amount), gas: formatEther(gas) }, `funded ${positionals.length} account(s)`);
}
