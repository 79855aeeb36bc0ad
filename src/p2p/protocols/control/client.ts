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
import { Validators } from '../../validators.ts';
import { parsePeerRecord, type PeerRecord } from '../../vocabulary.ts';

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
  if (target instanceof Validators) return askValidators(node, target, message, timeoutMs, signal);
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

/**
 * A request to a set of validators: to the current one, then to each other in turn while the one asked cannot be reached
 * (a PeerUnreachableError: refused, gone, or silent past `timeoutMs`); an error answer is the validator's and ends it.
 * `status` answers teach the set the validators they list.
 */
async function askValidators(
  node: Libp2p, validators: Validators, message: Record<string, unknown>, timeoutMs: number, signal?: AbortSignal,
): Promise<Record<string, unknown>> {
  const tried: string[] = [];
  for (const addr of validators.all) {
    try {
      const answer = await request(node, addr, message, timeoutMs, signal);
      if (message.type === 'status' && Array.isArray(answer.peers)) validators.learn(answer.peers.flatMap(peerRecord));
      return answer;
    } catch (err) {
      // an error the validator answered (even PeerUnreachableError: its ledger's co-signers gone) is its own: not retried
      const answered = (err as { details?: { remoteError?: string } }).details?.remoteError !== undefined;
      if (!(err instanceof PeerUnreachableError) || answered || signal?.aborted) throw err;
      validators.failed(addr);
      tried.push(err.message);
    }
  }
  throw new PeerUnreachableError(`no validator answered (${tried.length}): ${tried.join('; ')}`);
}

/** A record of a status answer, parsed as its caller will parse it; one that does not parse teaches nothing. */
function peerRecord(p: unknown): PeerRecord[] {
  try {
    return [parsePeerRecord(p)];
  } catch {
    return [];
  }
}
