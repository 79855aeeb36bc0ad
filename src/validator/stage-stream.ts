import type { Libp2p } from '@libp2p/interface';
import { PeerUnreachableError } from '../errors.ts';
import {
  dialProtocol, encodeControl, errorFromWire, type Frame, isWireError, type PeerTarget, receiveFrames, RequestTable, sendMessage,
  STAGE_PROTOCOL,
} from '../p2p/index.ts';

/** A validator's stage stream to one worker: requests matched to answers by id, and the bytes that came back. */
export interface StageStream {
  /** Sends `header` (with the stream's own fields, an id, no tensors) and waits for its answer, or a typed error. */
  call(header: Record<string, unknown>): Promise<Frame>;
  close(): Promise<void>;
  /** Bytes received: tensors' payloads, control answers as their JSON. */
  readonly bytes: number;
}

/**
 * Opens a stage stream to `worker` for the validator's requests (audits, disputes): every request carries `fields`
 * (its job, the record it is about), each answer is matched by id within `timeoutMs`, a worker's wire error rejects
 * its request, and a stream that closes rejects every request still open. `what` names the stream in errors.
 * @example
 * const s = await openStageStream(node, worker, { what: 'audit', fields: { jobId }, timeoutMs })
 */
export async function openStageStream(
  node: Libp2p, worker: PeerTarget, opts: { what: string; fields: Record<string, unknown>; timeoutMs: number },
): Promise<StageStream> {
  const stream = await dialProtocol(node, worker, STAGE_PROTOCOL);
  const table = new RequestTable<Frame>(worker.peerId);
  let bytes = 0;
  receiveFrames(stream, (frame) => {
    bytes += frame.kind === 'tensor' ? frame.tensor.bytes.byteLength : JSON.stringify(frame.message).length;
    const id = frame.kind === 'tensor' ? frame.tensor.requestId : (frame.message as { id?: unknown } | null)?.id;
    if (frame.kind === 'control' && isWireError(frame.message)) table.reject(id, errorFromWire(frame.message, worker.peerId));
    else table.resolve(id, frame);
  });
  stream.addEventListener('close', () => table.rejectAll(new PeerUnreachableError(`${worker.peerId} closed the ${opts.what} stream`)));
  return {
    call: async (header) => {
      const { id, answer } = table.open(opts.timeoutMs);
      try {
        await sendMessage(stream, [encodeControl({ ...header, ...opts.fields, id, tensors: 0 })]);
      } catch (cause) {
        table.reject(id, new PeerUnreachableError(`${worker.peerId}: cannot send on the ${opts.what} stream`, { cause }));
      }
      return answer;
    },
    close: () => stream.close().catch(() => {}),
    get bytes() {
      return bytes;
    },
  };
}
