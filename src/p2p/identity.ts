import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { generateKeyPair, privateKeyFromProtobuf, privateKeyToProtobuf } from '@libp2p/crypto/keys';
import type { PrivateKey } from '@libp2p/interface';
import { InvalidArgumentError } from '../errors.ts';

export const IDENTITY_FILE = 'identity.key';

/**
 * The node's Ed25519 key, kept in its data directory so that it has the same peer id
 * after a restart. Created on first use (file mode 0600).
 */
export async function loadOrCreateIdentity(dataDir: string): Promise<PrivateKey> {
  const path = join(dataDir, IDENTITY_FILE);
  if (existsSync(path)) {
    try {
      return privateKeyFromProtobuf(readFileSync(path));
    } catch (cause) {
      throw new InvalidArgumentError(`${path} is not a libp2p private key; move it away to create a new identity`, { cause });
    }
  }
  mkdirSync(dataDir, { recursive: true });
  const key = await generateKeyPair('Ed25519');
  writeFileSync(path, privateKeyToProtobuf(key), { mode: 0o600 });
  return key;
}
