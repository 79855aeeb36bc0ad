import type { Frame } from '../../frames.ts';
import { MAX_ROUTE } from '../stage/constants.ts';

/**
 * Messages of the result protocol: a tensor frame (requestId = the user's replyTo), preceded by
 * {id, type: 'records', records} (the chain's signed records), or a control error
 * {id, type: 'error', error, message}. Anything else is not a result.
 */
export type ResultMessage
  = | { id: number; kind: 'tensor'; frame: Frame & { kind: 'tensor' } }
    | { id: number; kind: 'error'; message: unknown }
    | { id: number; kind: 'records'; records: unknown[] };

export function parseResult(frame: Frame): ResultMessage | null {
  if (frame.kind === 'tensor') return { id: frame.tensor.requestId, kind: 'tensor', frame };
  const m = frame.message as { id?: unknown; type?: unknown } | null;
  if (typeof m !== 'object' || m === null || !Number.isSafeInteger(m.id)) return null;
  // the chain's signed records come just before its result
  if (m.type === 'records') {
    const records = (m as { records?: unknown }).records;
    return Array.isArray(records) && records.length <= MAX_ROUTE ? { id: m.id as number, kind: 'records', records } : null;
  }
  if (m.type !== 'error') return null;
  return { id: m.id as number, kind: 'error', message: m };
}
