import { InvalidMessageError } from '../errors.ts';

/**
 * The primitives every protocol schema is built from: each takes an untrusted value from a
 * peer and returns it typed, or throws InvalidMessageError naming the field and what it
 * must be. Schemas compose these; nothing that came off the wire is cast without them.
 */

export function fail(what: string): never {
  throw new InvalidMessageError(what);
}

/** A plain JSON object (not null, not an array). */
export function obj(v: unknown, what: string): Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) fail(`${what} must be an object`);
  return v as Record<string, unknown>;
}

/** A finite number in [min, max]. */
export function finite(v: unknown, what: string, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) fail(`${what} must be a number in [${min}, ${max}]`);
  return v;
}

/** An integer in [min, max]. */
export function int(v: unknown, what: string, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (!Number.isSafeInteger(v) || (v as number) < min || (v as number) > max) fail(`${what} must be an integer in [${min}, ${max}]`);
  return v as number;
}

/** A string of at most `maxLength` characters. */
export function str(v: unknown, what: string, maxLength: number): string {
  if (typeof v !== 'string' || v.length > maxLength) fail(`${what} must be a string of at most ${maxLength} characters`);
  return v;
}

/** A list of at most `maxItems` strings, each at most `maxLength` characters. */
export function strings(v: unknown, what: string, maxItems: number, maxLength = 512): string[] {
  if (!Array.isArray(v) || v.length > maxItems || !v.every((s) => typeof s === 'string' && s.length <= maxLength)) {
    fail(`${what} must be at most ${maxItems} strings of at most ${maxLength} characters`);
  }
  return v as string[];
}

/** A list of at most `maxItems` values, each parsed by `item`. */
export function list<T>(v: unknown, what: string, maxItems: number, item: (x: unknown, what: string) => T): T[] {
  if (!Array.isArray(v) || v.length > maxItems) fail(`${what} must be a list of at most ${maxItems} items`);
  return v.map((x, i) => item(x, `${what}[${i}]`));
}

/** One of a fixed set of strings. */
export function oneOf<T extends string>(v: unknown, what: string, values: readonly T[]): T {
  if (typeof v !== 'string' || !(values as readonly string[]).includes(v)) fail(`${what} must be one of ${values.join(', ')}`);
  return v as T;
}

/** A value that may be absent: undefined stays undefined, anything else goes through `parse`. */
export function optional<T>(v: unknown, parse: (x: unknown) => T): T | undefined {
  return v === undefined ? undefined : parse(v);
}

/** A libp2p peer id as text (base58btc multihash, or a base32 CID): letters and digits, at most 128. */
export function peerIdText(v: unknown, what: string): string {
  if (typeof v !== 'string' || !/^[A-Za-z0-9]{8,128}$/.test(v)) fail(`${what} must be a peer id`);
  return v;
}
