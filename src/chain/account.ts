import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { type PrivateKeyAccount, generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { InvalidArgumentError } from '../errors.ts';

/** A node's Ethereum key, kept beside its libp2p identity in its data directory. */
export const ACCOUNT_FILE = 'ethereum.key';

const KEY = /^0x[0-9a-f]{64}$/;

/**
 * The node's Ethereum account: the key in `dataDir` (created on first use, file mode 0600), or,
 * without a data directory, a new one for this run only.
 */
export function loadOrCreateAccount(dataDir?: string): PrivateKeyAccount {
  if (!dataDir) return privateKeyToAccount(generatePrivateKey());
  const path = join(dataDir, ACCOUNT_FILE);
  if (existsSync(path)) {
    const key = readFileSync(path, 'utf8').trim();
    if (!KEY.test(key)) throw new InvalidArgumentError(`${path} is not an Ethereum private key (0x and 64 hex digits); move it away to create a new account`);
    return privateKeyToAccount(key as `0x${string}`);
  }
  mkdirSync(dataDir, { recursive: true });
  const key = generatePrivateKey();
  writeFileSync(path, `${key}\n`, { mode: 0o600 });
  return privateKeyToAccount(key);
}
