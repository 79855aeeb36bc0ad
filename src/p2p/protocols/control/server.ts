import type { Libp2p, PeerId, Stream } from '@libp2p/interface';
import { InvalidMessageError, RateLimitedError } from '../../../errors.ts';
import { encodeControl, type Frame } from '../../frames.ts';
import { PeerRateLimiter } from '../../rate-limit.ts';
import { MAX_CONTROL_FRAME_BYTES } from '../../constants.ts';
import { receiveFrames, sendMessage, sendQuietly } from '../../stream.ts';
import { errorToWire } from '../../wire-errors.ts';
import { CONTROL_PROTOCOL, MAX_INBOUND_STREAMS, MAX_MESSAGES_PER_SECOND } from './constants.ts';
import { parseEnvelope } from './schema.ts';

export type Handler = (message: Record<string, unknown>, from: PeerId) => Promise<Record<string, unknown>> | Record<string, unknown>;

/**
 * Serves the control protocol from a table of handlers keyed by message type. A malformed
 * or unknown message gets a typed error answer (a broken frame resets the stream), a peer
 * over its rate gets RateLimitedError; the node keeps serving everyone else.
 */
export async function serveControl(node: Libp2p, handlers: Record<string, Handler>): Promise<void> {
  const limiter = new PeerRateLimiter(MAX_MESSAGES_PER_SECOND);
  node.addEventListener('peer:disconnect', (evt) => limiter.forget(evt.detail.toString()));
  await node.handle(
    CONTROL_PROTOCOL,
    (stream: Stream, connection) => {
      // a client sends its request and closes its side; this side closes once its answers are sent,
      // so that finished streams do not count against either peer's stream limits
      let answered: Promise<void> = Promise.resolve();
      stream.addEventListener('remoteCloseWrite', () => {
        void answered.finally(() => stream.close().catch(() => {}));
      });
      receiveFrames(stream, (frame: Frame) => {
        const from = connection.remotePeer;
        if (limiter.allow(from.toString())) {
          answered = Promise.all([answered, answer(stream, frame, handlers, from)]).then(() => {});
          return;
        }
        const id = frame.kind === 'control' ? ((frame.message as { id?: unknown } | null)?.id ?? null) : null;
        const refusal = errorToWire(new RateLimitedError(`more than ${MAX_MESSAGES_PER_SECOND} messages per second`));
        sendQuietly(stream, [encodeControl({ ...refusal, id })]);
      }, undefined, MAX_CONTROL_FRAME_BYTES);
    },
    { maxInboundStreams: MAX_INBOUND_STREAMS },
  );
}

async function answer(stream: Stream, frame: Frame, handlers: Record<string, Handler>, from: PeerId): Promise<void> {
  let id: unknown = null;
  let reply: Uint8Array;
  try {
    if (frame.kind !== 'control') throw new InvalidMessageError('the control protocol carries no tensors');
    const envelope = parseEnvelope(frame.message);
    id = envelope.id;
    const handler = Object.hasOwn(handlers, envelope.type) ? handlers[envelope.type] : undefined;
    if (!handler) throw new InvalidMessageError(`unknown message type '${envelope.type}'`);
    // encoded here: an answer too large for a control frame is an error answer, never an unhandled rejection
    reply = encodeControl({ ...(await handler(envelope.body, from)), id });
  } catch (err) {
    reply = encodeControl({ ...errorToWire(err), id: typeof id === 'number' ? id : null });
  }
  // a failure means the stream is gone (and was reset): nothing more to do
  await sendMessage(stream, [reply]).catch(() => {});
}
