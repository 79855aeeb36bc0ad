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
  /** Another peer the error is about (a neighbour a worker could not pass a result to), when it names one. */
  about?: string;
};

/** Characters of a peer id an error may name: libp2p's are about 52. */
const MAX_ABOUT = 128;

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
  if (err instanceof TensorLinkError) {
    const about = err.details?.about;
    return { type: 'error', error: err.name, message: err.message.slice(0, MAX_MESSAGE), ...(typeof about === 'string' ? { about: about.slice(0, MAX_ABOUT) } : {}) };
  }
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
  let about: { about?: string } = {};
  try {
    const m = obj(message, 'error');
    if (typeof m.error === 'string' && CLASSES.has(m.error)) name = m.error;
    if (typeof m.message === 'string') text = m.message.slice(0, MAX_MESSAGE);
    if (typeof m.about === 'string') about = { about: m.about.slice(0, MAX_ABOUT) };
  } catch {
    // a malformed error answer is still an error
  }
  const Class = CLASSES.get(name) ?? TensorLinkError;
  return new Class(`${from}: ${text}`, { details: { peer: from, remoteError: name, ...about } });
}
