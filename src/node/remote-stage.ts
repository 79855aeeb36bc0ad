import type { Libp2p, PeerId, Stream } from '@libp2p/interface';
import type { Multiaddr } from '@multiformats/multiaddr';
import { InvalidMessageError, PeerUnreachableError, UnauthorizedError } from '../errors.ts';
import { DIAL_TIMEOUT_MS, REQUEST_TIMEOUT_MS } from '../p2p/constants.ts';
import { encodeControl, encodeTensor, type Frame } from '../p2p/frames.ts';
import { receiveFrames, sendMessage } from '../p2p/stream.ts';
import type { Tensor } from '../tensor/index.ts';
import { request } from './control.ts';
import { chunksOf } from './chunks.ts';
import { RESULT_PROTOCOL, STAGE_PROTOCOL } from './stage.ts';
import { fromWire, toWire } from './wire-tensor.ts';

function frameMessage(frame: Frame): Record<string, unknown> {
  if (frame.kind !== 'control' || typeof frame.message !== 'object' || frame.message === null) throw new InvalidMessageError('expected a control answer');
  return frame.message as Record<string, unknown>;
}

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

  /** Sends one request (a control frame and its tensors) and waits for its answer. */
  async call(header: Record<string, unknown>, tensors: Tensor[], timeoutMs = REQUEST_TIMEOUT_MS): Promise<Frame> {
    if (this.stream.status !== 'open') throw new PeerUnreachableError(`${this.peer.toString()}: the stage stream is ${this.stream.status}`);
    const id = this.nextId++;
    const answer = new Promise<Frame>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        reject(new PeerUnreachableError(`${this.peer.toString()} did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiting.set(id, { resolve, reject, timer });
    });
    const parts = tensors.flatMap((t) => encodeTensor(toWire(t, id)));
    try {
      await sendMessage(this.stream, [encodeControl({ ...header, id, jobId: this.jobId }), ...parts]);
    } catch (cause) {
      const w = this.waiting.get(id);
      if (w) clearTimeout(w.timer);
      this.waiting.delete(id);
      answer.catch(() => {});
      throw new PeerUnreachableError(`${this.peer.toString()}: cannot send on the stage stream`, { cause });
    }
    return answer;
  }

  /**
   * Sends a forward that travels on along `route` (the later stages' addresses); the last
   * stage delivers the output to `replyTo` (this user's result inbox). Nothing comes back here.
   */
  async forwardChained(
    sessionId: string,
    tensors: Tensor[],
    route: string[],
    replyTo: { addr: string; requestId: number },
  ): Promise<void> {
    const id = this.nextId++;
    const header = encodeControl({ type: 'forward', id, jobId: this.jobId, sessionId, tensors: tensors.length, route, replyTo });
    await sendMessage(this.stream, [header, ...tensors.flatMap((t) => encodeTensor(toWire(t, id)))]);
  }

  /**
   * Builds a section on the worker: sends the manifest (each weight as the sha256 addresses of
   * its chunks), then only the chunks the worker lacks (it may hold them from an earlier job, a
   * load broken off, or its disk), each hash-checked on arrival. Returns how many chunks went.
   */
  async load(
    config: Record<string, unknown>,
    section: [number, number],
    weights: Map<string, Tensor>,
    upstream?: string,
    options: { signal?: AbortSignal; onChunk?: (sent: number, needed: number) => void } = {},
  ): Promise<{ chunksSent: number; chunks: number }> {
    const chunks = new Map<string, Uint8Array>();
    const manifest = [...weights].map(([name, t]) => {
      const parts = chunksOf(t);
      for (const c of parts) chunks.set(c.sha, c.bytes);
      return { name, shape: [...t.shape], chunks: parts.map((c) => c.sha) };
    });
    const answer = await this.call({ type: 'load', config, section, weights: manifest, tensors: 0, ...(upstream ? { upstream } : {}) }, []);
    const need = frameMessage(answer).chunks;
    if (!Array.isArray(need) || !need.every((c) => typeof c === 'string' && chunks.has(c))) throw new InvalidMessageError('load: the worker asked for unknown chunks');
    let sent = 0;
    for (const sha of need as string[]) {
      // a load stopped here resumes later: the worker keeps the chunks that arrived
      if (options.signal?.aborted) throw new PeerUnreachableError(`the load of section [${section}) was stopped after ${sent} of ${need.length} chunks`);
      const bytes = chunks.get(sha)!;
      const id = this.nextId++;
      const wire = { requestId: id, dtype: 'float32' as const, shape: [bytes.length / 4], bytes };
      await sendMessage(this.stream, [encodeControl({ type: 'chunk', id, jobId: this.jobId, sha, tensors: 1 }), ...encodeTensor(wire)]);
      options.onChunk?.(++sent, need.length);
    }
    await this.call({ type: 'assemble', tensors: 0 }, []);
    return { chunksSent: need.length, chunks: chunks.size };
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

/**
 * Where chained forwards end: the user's side of the result protocol. Answers are matched
 * to the request ids it hands out; anything else is ignored.
 */
export class ResultInbox {
  private nextId = 1;
  private readonly waiting = new Map<number, Waiter>();

  private constructor(readonly addr: string) {}

  static async start(node: Libp2p): Promise<ResultInbox> {
    const addr = node.getMultiaddrs()[0]?.toString();
    if (!addr) throw new PeerUnreachableError('this node listens on no address; chained results cannot reach it');
    const inbox = new ResultInbox(addr);
    await node.handle(RESULT_PROTOCOL, (stream: Stream) => {
      receiveFrames(stream, (frame) => inbox.deliver(frame));
    });
    return inbox;
  }

  private deliver(frame: Frame): void {
    const id = frame.kind === 'tensor' ? frame.tensor.requestId : (frame.message as { id?: number } | null)?.id;
    const w = typeof id === 'number' ? this.waiting.get(id) : undefined;
    if (!w) return;
    this.waiting.delete(id as number);
    clearTimeout(w.timer);
    if (frame.kind === 'control') {
      const m = frame.message as { error?: string; message?: string };
      w.reject(m.error === 'UnauthorizedError' ? new UnauthorizedError(String(m.message)) : new InvalidMessageError(String(m.message), { details: m }));
    } else w.resolve(frame);
  }

  /** A request id and the promise of its result tensor. */
  expect(timeoutMs = REQUEST_TIMEOUT_MS): { requestId: number; result: Promise<Tensor> } {
    const requestId = this.nextId++;
    const result = new Promise<Frame>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(requestId);
        reject(new PeerUnreachableError(`no result within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiting.set(requestId, { resolve, reject, timer });
    }).then((f) => {
      if (f.kind !== 'tensor') throw new InvalidMessageError('a result must be a tensor');
      return fromWire(f.tensor);
    });
    return { requestId, result };
  }
}
