import type { Libp2p, PeerId, Stream } from '@libp2p/interface';
import type { Multiaddr } from '@multiformats/multiaddr';
import { InvalidMessageError, PeerUnreachableError, RateLimitedError, TensorLinkError, UnauthorizedError } from '../errors.ts';
import { DIAL_TIMEOUT_MS, MAX_MESSAGES_PER_SECOND, REQUEST_TIMEOUT_MS } from '../p2p/constants.ts';
import { encodeControl, type Frame } from '../p2p/frames.ts';
import { receiveFrames } from '../p2p/stream.ts';
import { obj } from './vocabulary.ts';

/** The control protocol: JSON requests {id, type, ...} answered by {id, type, ...} or {id, type: 'error'}. */
export const CONTROL_PROTOCOL = '/tensorlink/control/1.0.0';

export type Handler = (message: Record<string, unknown>, from: PeerId) => Promise<Record<string, unknown>> | Record<string, unknown>;

/**
 * Serves the control protocol from a table of handlers keyed by message type. A malformed
 * or unknown message gets a typed error answer (a broken frame resets the stream); the
 * node keeps serving everyone else.
 */
export async function serveControl(node: Libp2p, handlers: Record<string, Handler>): Promise<void> {
  const buckets = new Map<string, { tokens: number; at: number }>();
  const allow = (peer: PeerId): boolean => {
    const key = peer.toString();
    const now = Date.now();
    const b = buckets.get(key) ?? { tokens: MAX_MESSAGES_PER_SECOND, at: now };
    b.tokens = Math.min(MAX_MESSAGES_PER_SECOND, b.tokens + ((now - b.at) / 1000) * MAX_MESSAGES_PER_SECOND);
    b.at = now;
    buckets.set(key, b);
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  };
  await node.handle(
    CONTROL_PROTOCOL,
    (stream: Stream, connection) => {
      receiveFrames(stream, (frame: Frame) => {
        if (!allow(connection.remotePeer)) {
          const id = frame.kind === 'control' ? (frame.message as { id?: unknown } | null)?.id ?? null : null;
          const e = new RateLimitedError(`more than ${MAX_MESSAGES_PER_SECOND} messages per second`);
          try {
            stream.send(encodeControl({ id, type: 'error', error: e.name, message: e.message }));
          } catch {
            // the stream is gone
          }
          return;
        }
        void answer(stream, frame, handlers, connection.remotePeer);
      });
    },
    { maxInboundStreams: 64 },
  );
}

async function answer(stream: Stream, frame: Frame, handlers: Record<string, Handler>, from: PeerId): Promise<void> {
  let id: unknown = null;
  try {
    if (frame.kind !== 'control') throw new InvalidMessageError('the control protocol carries no tensors');
    const message = obj(frame.message, 'message');
    id = message.id;
    if (typeof id !== 'number' || !Number.isSafeInteger(id)) throw new InvalidMessageError('message.id must be an integer');
    const type = message.type;
    const handler = typeof type === 'string' && Object.hasOwn(handlers, type) ? handlers[type] : undefined;
    if (!handler) throw new InvalidMessageError(`unknown message type '${String(type)}'`);
    const reply = await handler(message, from);
    stream.send(encodeControl({ ...reply, id }));
  } catch (err) {
    const e = err instanceof TensorLinkError ? err : new TensorLinkError('internal error');
    try {
      stream.send(encodeControl({ id, type: 'error', error: e.name, message: e.message }));
    } catch {
      // the stream is gone; nothing to tell
    }
  }
}

let nextId = 1;

/** Sends one request on a fresh stream and waits for its answer (typed errors on failure or timeout). */
export async function request(
  node: Libp2p,
  peer: PeerId | Multiaddr,
  message: Record<string, unknown>,
  timeoutMs = REQUEST_TIMEOUT_MS,
): Promise<Record<string, unknown>> {
  let stream: Stream;
  try {
    stream = await node.dialProtocol(peer, CONTROL_PROTOCOL, { signal: AbortSignal.timeout(DIAL_TIMEOUT_MS) });
  } catch (cause) {
    throw new PeerUnreachableError(`cannot reach ${peer.toString()}: ${(cause as Error).message}`, { cause });
  }
  const id = nextId++;
  try {
    const reply = await new Promise<Record<string, unknown>>((resolve, reject) => {
      const timer = setTimeout(() => reject(new PeerUnreachableError(`no answer from ${peer.toString()} within ${timeoutMs} ms`)), timeoutMs);
      stream.addEventListener('close', () => {
        clearTimeout(timer);
        reject(new PeerUnreachableError(`${peer.toString()} closed the stream`));
      });
      receiveFrames(stream, (frame) => {
        if (frame.kind !== 'control') return;
        const m = frame.message as Record<string, unknown>;
        if (m?.id !== id) return;
        clearTimeout(timer);
        resolve(m);
      });
      stream.send(encodeControl({ ...message, id }));
    });
    if (reply.type === 'error') {
      const text = `${peer.toString()} refused the request: ${String(reply.message)}`;
      if (reply.error === 'UnauthorizedError') throw new UnauthorizedError(text, { details: reply });
      if (reply.error === 'RateLimitedError') throw new RateLimitedError(text, { details: reply });
      throw new InvalidMessageError(text, { details: reply });
    }
    return reply;
  } finally {
    await stream.close().catch(() => {});
  }
}
