import type { Stream } from '@libp2p/interface';
import { InvalidMessageError, PeerUnreachableError } from '../errors.ts';
import { MAX_FRAME_BYTES, SEND_CHUNK_BYTES, SEND_STALL_MS } from './constants.ts';
import { decodeFrame, type Frame, FrameReader } from './frames.ts';

/** Bytes this process has sent and received through TensorLink's framed protocols. */
export const traffic = { sent: 0, received: 0 };

export interface SendOptions {
  /** Cancels the send (the stream is reset: a frame cut in half cannot be taken back). */
  signal?: AbortSignal;
  /** The send fails when the peer takes no bytes for this long (default SEND_STALL_MS). */
  stallMs?: number;
}

/**
 * Writes frame parts to a stream in bounded chunks, waiting for 'drain' whenever the
 * stream's send buffer is full (backpressure), so a 64 MiB tensor never sits in memory
 * twice. A peer that stops reading cannot hold the sender: after `stallMs` without progress
 * (or when `signal` aborts) the stream is reset and the send fails with PeerUnreachableError.
 */
export async function sendParts(stream: Stream, parts: Uint8Array[], options: SendOptions = {}): Promise<void> {
  const stallMs = options.stallMs ?? SEND_STALL_MS;
  for (const part of parts) {
    for (let offset = 0; offset < part.length; offset += SEND_CHUNK_BYTES) {
      const chunk = part.subarray(offset, Math.min(part.length, offset + SEND_CHUNK_BYTES));
      if (options.signal?.aborted) throw giveUp(stream, 'the send was cancelled');
      traffic.sent += chunk.length;
      if (stream.send(chunk)) continue;
      const stalled = AbortSignal.timeout(stallMs);
      try {
        await stream.onDrain({ signal: options.signal ? AbortSignal.any([options.signal, stalled]) : stalled });
      } catch (cause) {
        throw giveUp(stream, stalled.aborted ? `the peer took no bytes for ${stallMs} ms` : 'the stream closed while sending', cause);
      }
    }
  }
}

function giveUp(stream: Stream, why: string, cause?: unknown): PeerUnreachableError {
  const err = new PeerUnreachableError(`cannot send: ${why}`, { cause });
  stream.abort(err);
  return err;
}

const locks = new WeakMap<Stream, Promise<void>>();

/**
 * Sends the parts of one message with nothing else in between: concurrent senders on a
 * shared stream take turns, so a control frame is always followed by its own tensors.
 * Every send in TensorLink goes through here (or sendParts), with its stall deadline.
 */
export async function sendMessage(stream: Stream, parts: Uint8Array[], options: SendOptions = {}): Promise<void> {
  const previous = locks.get(stream) ?? Promise.resolve();
  const mine = previous.then(() => sendParts(stream, parts, options));
  locks.set(
    stream,
    mine.catch(() => {}),
  );
  await mine;
}

/** sendMessage for answers nobody awaits: a failure means the stream is gone (and was reset), nothing more to do. */
export function sendQuietly(stream: Stream, parts: Uint8Array[], options: SendOptions = {}): void {
  sendMessage(stream, parts, options).catch(() => {});
}

/**
 * Calls `onFrame` for every complete frame that arrives on the stream. A malformed frame
 * resets the stream (its framing can no longer be trusted) and is reported to `onError`;
 * the node itself carries on. A frame announcing more than `maxFrameBytes` (the protocol's
 * largest) is refused at its length, before its body is buffered.
 */
export function receiveFrames(
  stream: Stream, onFrame: (frame: Frame) => void, onError?: (err: InvalidMessageError) => void, maxFrameBytes = MAX_FRAME_BYTES,
): void {
  const reader = new FrameReader(maxFrameBytes);
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
