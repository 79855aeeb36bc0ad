import * as errors from '../errors.ts';
import { TensorLinkError } from '../errors.ts';
import { obj } from './schema.ts';

/**
 * The one place where errors become wire messages and wire messages become errors again:
 * a worker's InvalidArgumentError ("the section needs N bytes, this worker offers M")
 * reaches the user as an InvalidArgumentError with that message, prefixed by who said it.
 * An error name the peer made up becomes a plain TensorLinkError (never a class we did not
 * list), and the texts are cut to a bounded length.
 */

/** The wire form of an error answer: `{id, type: 'error', error: NAME, message}`. */
export type WireError = {
  type: 'error';
  error: string;
  message: string;
};

/** Characters of an error message on the wire: a sentence a person reads, never a dump. */
const MAX_MESSAGE = 2_000;

type ErrorClass = new (message: string, options?: { details?: Record<string, unknown>; cause?: unknown }) => TensorLinkError;

/** Every typed error by name (errors.ts is the list). */
const CLASSES = new Map<string, ErrorClass>(
  (Object.values(errors) as unknown[])
    .filter((v): v is ErrorClass => typeof v === 'function' && (v === TensorLinkError || v.prototype instanceof TensorLinkError))
    .map((c) => [new c('').name, c]),
);

/** An error as a wire message; anything that is not one of ours is an internal error (its text kept short). */
export function errorToWire(err: unknown): WireError {
  if (err instanceof TensorLinkError) return { type: 'error', error: err.name, message: err.message.slice(0, MAX_MESSAGE) };
  const text = err instanceof Error ? err.message : String(err);
  return { type: 'error', error: 'TensorLinkError', message: `internal error: ${text}`.slice(0, MAX_MESSAGE) };
}

/** True when a control message is an error answer. */
export function isWireError(message: unknown): boolean {
  return typeof message === 'object' && message !== null && (message as { type?: unknown }).type === 'error';
}

/**
 * The typed error a peer's error answer stands for. `from` names the peer in the message
 * ("12D3Koo…: the section needs …"); the peer's own words follow unchanged.
 */
export function errorFromWire(message: unknown, from: string): TensorLinkError {
  let name = 'TensorLinkError';
  let text = 'an error without a message';
  try {
    const m = obj(message, 'error');
    if (typeof m.error === 'string' && CLASSES.has(m.error)) name = m.error;
    if (typeof m.message === 'string') text = m.message.slice(0, MAX_MESSAGE);
  } catch {
    // a malformed error answer is still an error
  }
  const Class = CLASSES.get(name) ?? TensorLinkError;
  return new Class(`${from}: ${text}`, { details: { peer: from, remoteError: name } });
}
