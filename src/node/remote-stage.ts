import type { Libp2p, PeerId, Stream } from '@libp2p/interface';
import type { Multiaddr } from '@multiformats/multiaddr';
import { InvalidMessageError, PeerUnreachableError, UnauthorizedError } from '../errors.ts';
import { DIAL_TIMEOUT_MS, REQUEST_TIMEOUT_MS } from '../p2p/constants.ts';
import { encodeControl, encodeTensor, type Frame } from '../p2p/frames.ts';
import { receiveFrames, sendParts } from '../p2p/stream.ts';
import type { Tensor } from '../tensor/index.ts';
import { request } from './control.ts';
import { sha256, STAGE_PROTOCOL } from './stage.ts';
import { fromWire, toWire } from './wire-tensor.ts';

type Waiter = { resolve: (v: Frame) => void; reject: (e: Error) => void; timer: ReturnType<typeof setTimeout> };

/**
 * The user's handle on one section of a job on one worker: one long-lived stream, requests
 * matched to answers by id.
 */
export class RemoteStage {
  private nextId = 1;
  private readonly waiting = new Map<number, Waiter>();

  private constructor(
    readonly peer: PeerId | Multiaddr,
    readonly jobId: string,
    private readonly stream: Stream,
  ) {
    receiveFrames(stream, (frame) => {
      const id = frame.kind === 'tensor' ? frame.tensor.requestId : (frame.message as { id?: number } | null)?.id;
      const w = typeof id === 'number' ? this.waiting.get(id) : undefined;
      if (!w) return;
      this.waiting.delete(id as number);
      clearTimeout(w.timer);
      if (frame.kind === 'control' && (frame.message as { type?: string }).type === 'error') {
        const m = frame.message as { error?: string; message?: string };
        const text = `${peer.toString()}: ${m.message}`;
        w.reject(m.error === 'UnauthorizedError' ? new UnauthorizedError(text) : new InvalidMessageError(text, { details: m }));
      } else w.resolve(frame);
    });
    stream.addEventListener('close', () => {
      for (const w of this.waiting.values()) {
        clearTimeout(w.timer);
        w.reject(new PeerUnreachableError(`${peer.toString()} closed the stage stream`));
      }
      this.waiting.clear();
    });
  }

  /** Opens (and so owns) job `jobId` on the worker and its stage stream. */
  static async open(node: Libp2p, peer: PeerId | Multiaddr, jobId: string): Promise<RemoteStage> {
    await request(node, peer, { type: 'open-job', jobId });
    try {
      const stream = await node.dialProtocol(peer, STAGE_PROTOCOL, { signal: AbortSignal.timeout(DIAL_TIMEOUT_MS) });
      return new RemoteStage(peer, jobId, stream);
    } catch (cause) {
      throw new PeerUnreachableError(`cannot open a stage on ${peer.toString()}`, { cause });
    }
  }

  private async call(header: Record<string, unknown>, tensors: Tensor[]): Promise<Frame> {
    const id = this.nextId++;
    const answer = new Promise<Frame>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        reject(new PeerUnreachableError(`${this.peer.toString()} did not answer within ${REQUEST_TIMEOUT_MS} ms`));
      }, REQUEST_TIMEOUT_MS);
      this.waiting.set(id, { resolve, reject, timer });
    });
    this.stream.send(encodeControl({ ...header, id, jobId: this.jobId }));
    for (const t of tensors) await sendParts(this.stream, encodeTensor(toWire(t, id)));
    return answer;
  }

  /** Sends a section's weights (hash-checked by the worker) and builds it there. */
  async load(config: Record<string, unknown>, section: [number, number], weights: Map<string, Tensor>): Promise<void> {
    const names = [...weights.keys()];
    const tensors = names.map((n) => weights.get(n)!);
    const listed = names.map((name, i) => {
      const t = tensors[i];
      return { name, sha256: sha256(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength)) };
    });
    await this.call({ type: 'load', config, section, weights: listed }, tensors);
  }

  /** Runs the section for one session (the worker keeps its KV cache). */
  async forward(sessionId: string, input: Tensor, positions: Tensor, keyMask: Tensor | null): Promise<Tensor> {
    const frame = await this.call({ type: 'forward', sessionId, tensors: keyMask ? 3 : 2 }, keyMask ? [input, positions, keyMask] : [input, positions]);
    if (frame.kind !== 'tensor') throw new InvalidMessageError('a forward answer must be a tensor');
    return fromWire(frame.tensor);
  }

  async closeSession(sessionId: string): Promise<void> {
    await this.call({ type: 'close', sessionId, tensors: 0 }, []);
  }

  async close(): Promise<void> {
    await this.stream.close().catch(() => {});
  }
}
