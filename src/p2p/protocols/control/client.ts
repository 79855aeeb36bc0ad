import type { Libp2p } from '@libp2p/interface';
import { InvalidMessageError, PeerUnreachableError } from '../../../errors.ts';
import { type DialTarget, dialProtocol, targetName } from '../../dial.ts';
import { MAX_CONTROL_FRAME_BYTES } from '../../constants.ts';
import { encodeControl } from '../../frames.ts';
import { RequestTable } from '../../requests.ts';
import { obj } from '../../schema.ts';
import { receiveFrames, sendMessage } from '../../stream.ts';
import { errorFromWire, isWireError } from '../../wire-errors.ts';
import { CONTROL_PROTOCOL, REQUEST_TIMEOUT_MS } from './constants.ts';

/**
 * Sends one control request on a fresh stream and waits for its answer. An error answer
 * becomes the typed error the peer named (UnauthorizedError, InvalidArgumentError, ...);
 * no answer within `timeoutMs`, a closed stream or an abort is a PeerUnreachableError.
 */
export async function request(
  node: Libp2p,
  target: DialTarget,
  message: Record<string, unknown>,
  timeoutMs = REQUEST_TIMEOUT_MS,
  signal?: AbortSignal,
): Promise<Record<string, unknown>> {
  const peer = targetName(target);
  const stream = await dialProtocol(node, target, CONTROL_PROTOCOL, signal);
  const table = new RequestTable<Record<string, unknown>>(peer);
  const { id, answer } = table.open(timeoutMs, signal);
  stream.addEventListener('close', () => table.rejectAll(new PeerUnreachableError(`${peer} closed the stream`)));
  receiveFrames(stream, (frame) => {
    if (frame.kind !== 'control') return;
    let m: Record<string, unknown>;
    try {
      m = obj(frame.message, 'answer');
    } catch (err) {
      table.reject(id, err as InvalidMessageError);
      return;
    }
    if (m.id !== id) return;
    if (isWireError(m)) table.reject(id, errorFromWire(m, peer));
    else table.resolve(id, m);
  }, undefined, MAX_CONTROL_FRAME_BYTES);
  try {
    try {
      await sendMessage(stream, [encodeControl({ ...message, id })], { signal });
    } catch (cause) {
      // the stream was reset under us (the peer refused it, or went away): the peer is unreachable for this request
      throw cause instanceof PeerUnreachableError ? cause : new PeerUnreachableError(`${peer}: the request could not be sent`, { cause });
    }
    return await answer;
  } catch (err) {
    table.rejectAll(err as Error);
    answer.catch(() => {});
    throw err;
  } finally {
    await stream.close().catch(() => {});
  }
}
