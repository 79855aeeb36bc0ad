// src/verify/records/ed25519.ts for the browser build: the same two functions by @noble/curves (RFC 8032, deterministic: the
// same signatures as Node's OpenSSL gives), so a tab signs its records as any worker does.
import { ed25519 } from '@noble/curves/ed25519.js';

const toBase64 = (b: Uint8Array) => btoa(String.fromCharCode(...b));

/** The Ed25519 signature (base64) of `bytes` by the key of the 32-byte `seed`. */
export function signEd25519(bytes: Uint8Array, seed: Uint8Array): string {
  return toBase64(ed25519.sign(bytes, seed.subarray(0, 32)));
}

/** Whether `sig` (base64) signs `bytes` under the raw 32-byte Ed25519 `publicKey` (false for anything malformed). */
export function verifyEd25519(bytes: Uint8Array, sig: string, publicKey: Uint8Array): boolean {
  try {
    const raw = Uint8Array.from(atob(sig), (c) => c.charCodeAt(0));
    return ed25519.verify(raw, bytes, publicKey);
  } catch {
    return false;
  }
}
