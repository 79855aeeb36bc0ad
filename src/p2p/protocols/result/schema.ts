import type { Frame } from '../../frames.ts';

/**
 * Messages of the result protocol: a tensor frame (requestId = the user's replyTo) or a
 * control error {id, type: 'error', error, message}. Anything else is not a result.
 */
export type ResultMessage = { id: number; kind: 'tensor'; frame: Frame & { kind: 'tensor' } } | { id: number; kind: 'error'; message: unknown };

export function parseResult(frame: Frame): ResultMessage | null {
  if (frame.kind === 'tensor') return { id: frame.tensor.requestId, kind: 'tensor', frame };
  const m = frame.message as { id?: unknown; type?: unknown } | null;
  if (typeof m !== 'object' || m === null || m.type !== 'error' || !Number.isSafeInteger(m.id)) return null;
  return { id: m.id as number, kind: 'error', message: m };
}
