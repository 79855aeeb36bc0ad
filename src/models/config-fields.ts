import { InvalidArgumentError } from '../errors.ts';

/** Readers of config.json fields for the family files: one-line errors that name the key. */

type Json = Record<string, unknown>;

/** A number field, or `fallback` when it is absent or null (absent without a fallback: an error). */
export function num(raw: Json, key: string, fallback?: number): number {
  const v = raw[key];
  if (v === undefined || v === null) {
    if (fallback === undefined) throw new InvalidArgumentError(`config.json lacks '${key}'`);
    return fallback;
  }
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new InvalidArgumentError(`config.json '${key}' must be a number`);
  return v;
}

/** A token id field: a number, or the first of a list (eos_token_id may list several). */
export function firstId(v: unknown): number | undefined {
  if (typeof v === 'number') return v;
  if (Array.isArray(v) && typeof v[0] === 'number') return v[0];
  return undefined;
}
