// `node:crypto` for the browser bundle: the SHA-256 digests the protocol schemas compute (content hashes of weights and
// files), by @noble/hashes, which libp2p brings. Only what those modules call is here.
import { sha256 } from '@noble/hashes/sha2.js';
import { bytesToHex, utf8ToBytes } from '@noble/hashes/utils.js';

export function createHash(algorithm: string) {
  if (algorithm !== 'sha256') throw new Error(`the browser build has only sha256, not ${algorithm}`);
  const h = sha256.create();
  const digest = {
    update(data: Uint8Array | string) {
      h.update(typeof data === 'string' ? utf8ToBytes(data) : data);
      return digest;
    },
    digest(encoding?: 'hex') {
      const out = h.digest();
      return encoding === 'hex' ? bytesToHex(out) : out;
    },
  };
  return digest;
}
