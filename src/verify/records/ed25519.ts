import { createPrivateKey, createPublicKey, type KeyObject, sign, verify } from 'node:crypto';

// Ed25519 by Node's crypto (OpenSSL): records, acceptances and the ledger's block headers. The browser build of a
// tab's worker replaces this module with src/browser/twins/ed25519.ts (the same two functions by @noble/curves).

const PKCS8_ED25519 = Buffer.from('302e020100300506032b657004220420', 'hex');
const SPKI_ED25519 = Buffer.from('302a300506032b6570032100', 'hex');
const privateKeys = new WeakMap<Uint8Array, KeyObject>();
const publicKeys = new Map<string, KeyObject>();

function privateKeyOf(seed: Uint8Array): KeyObject {
  let key = privateKeys.get(seed);
  if (!key) {
    key = createPrivateKey({ key: Buffer.concat([PKCS8_ED25519, seed.subarray(0, 32)]), format: 'der', type: 'pkcs8' });
    privateKeys.set(seed, key);
  }
  return key;
}

function publicKeyOf(raw: Uint8Array): KeyObject {
  const hex = Buffer.from(raw).toString('hex');
  let key = publicKeys.get(hex);
  if (!key) {
    key = createPublicKey({ key: Buffer.concat([SPKI_ED25519, raw]), format: 'der', type: 'spki' });
    if (publicKeys.size > 4096) publicKeys.clear();
    publicKeys.set(hex, key);
  }
  return key;
}

/**
 * The Ed25519 signature (base64) of `bytes` by the key of the 32-byte `seed`.
 * @example
 * verifyEd25519(bytes, signEd25519(bytes, seed), publicKey) // true where publicKey is the seed's
 */
export function signEd25519(bytes: Uint8Array, seed: Uint8Array): string {
  return sign(null, bytes, privateKeyOf(seed)).toString('base64');
}

/**
 * Whether `sig` (base64) signs `bytes` under the raw 32-byte Ed25519 `publicKey` (false for anything malformed).
 * @example
 * verifyEd25519(bytes, 'not base64', publicKey) // false, never a throw
 */
export function verifyEd25519(bytes: Uint8Array, sig: string, publicKey: Uint8Array): boolean {
  try {
    return verify(null, bytes, publicKeyOf(publicKey), Buffer.from(sig, 'base64'));
  } catch {
    return false;
  }
}
