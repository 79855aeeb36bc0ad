import type { Stream } from '@libp2p/interface';
import { InvalidMessageError } from '../errors.ts';
import { SEND_CHUNK_BYTES } from './constants.ts';
import { decodeFrame, type Frame, FrameReader } from './frames.ts';

/** Bytes this process has sent and received through TensorLink's framed protocols. */
export const traffic = { sent: 0, received: 0 };

/**
 * Writes frame parts to a stream in bounded chunks, waiting for 'drain' whenever the
 * stream's send buffer is full (backpressure), so a 64 MiB tensor never sits in memory twice.
 */
export async function sendParts(stream: Stream, parts: Uint8Array[], signal?: AbortSignal): Promise<void> {
  for (const part of parts) {
    for (let offset = 0; offset < part.length; offset += SEND_CHUNK_BYTES) {
      const chunk = part.subarray(offset, Math.min(part.length, offset + SEND_CHUNK_BYTES));
      traffic.sent += chunk.length;
      if (!stream.send(chunk)) await stream.onDrain({ signal });
    }
  }
}

/**
 * Calls `onFrame` for every complete frame that arrives on the stream. A malformed frame
 * resets the stream (its framing can no longer be trusted) and is reported to `onError`;
 * the node itself carries on.
 */
export function receiveFrames(stream: Stream, onFrame: (frame: Frame) => void, onError?: (err: InvalidMessageError) => void): void {
  const reader = new FrameReader();
  stream.addEventListener('message', (evt) => {
    traffic.received += evt.data.byteLength;
    try {
      for (const body of reader.push(evt.data.subarray())) onFrame(decodeFrame(body));
    } catch (err) {
      if (!(err instanceof InvalidMessageError)) throw err;
      onError?.(err);
      stream.abort(err);
    }
  });
}

const locks = new WeakMap<Stream, Promise<void>>();

/**
 * Sends the parts of one message with nothing else in between: concurrent senders on a
 * shared stream take turns, so a control frame is always followed by its own tensors.
 */
export async function sendMessage(stream: Stream, parts: Uint8Array[], signal?: AbortSignal): Promise<void> {
  const previous = locks.get(stream) ?? Promise.resolve();
  const mine = previous.then(() => sendParts(stream, parts, signal));
  locks.set(
    stream,
    mine.catch(() => {}),
  );
  await mine;
}
