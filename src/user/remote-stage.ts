import type { Libp2p, Stream } from '@libp2p/interface';
import type { Multiaddr } from '@multiformats/multiaddr';
import { InvalidMessageError, PeerUnreachableError } from '../errors.ts';
import {
  chunksOf, dialProtocol, encodeControl, encodeTensor, errorFromWire, type Frame, fromWire, isWireError,
  parseNeedAnswer, type PeerTarget, receiveFrames, RequestTable, request, sendMessage, STAGE_PROTOCOL, STAGE_REQUEST_TIMEOUT_MS,
  type StageAssignment, targetName, toWire, type WireTensor,
} from '../p2p/index.ts';
import type { Tensor } from '../tensor/index.ts';

/** The control answer of a request (a typed error when a tensor came instead). */
export function controlAnswer(frame: Frame, what: string): Record<string, unknown> {
  if (frame.kind !== 'control' || typeof frame.message !== 'object' || frame.message === null) throw new InvalidMessageError(`${what}: expected a control answer`);
  return frame.message as Record<string, unknown>;
}

/** The tensor answer of a request (a typed error when a control message came instead). */
export function tensorAnswer(frame: Frame, what: string): Tensor {
  if (frame.kind !== 'tensor') throw new InvalidMessageError(`${what}: expected a tensor`);
  return fromWire(frame.tensor);
}

/** Options of a section's load. */
export interface LoadOptions {
  /** Every section of the job: the only peers this worker may send the job's activations and gradients to. */
  assignment?: StageAssignment[];
  signal?: AbortSignal;
  onChunk?: (sent: number, needed: number) => void;
}

/**
 * The user's handle on one section of a job on one worker: one long-lived stream, requests
 * matched to answers by id, errors arriving as the typed errors the worker named.
 */
export class RemoteStage {
  private readonly table: RequestTable<Frame>;

  private constructor(
    readonly peer: string,
    readonly jobId: string,
    private readonly stream: Stream,
  ) {
    this.table = new RequestTable(peer);
    receiveFrames(stream, (frame) => {
      const id = frame.kind === 'tensor' ? frame.tensor.requestId : (frame.message as { id?: unknown } | null)?.id;
      if (frame.kind === 'control' && isWireError(frame.message)) this.table.reject(id, errorFromWire(frame.message, peer));
      else this.table.resolve(id, frame);
    });
    stream.addEventListener('close', () => this.table.rejectAll(new PeerUnreachableError(`${peer} closed the stage stream`)));
  }

  /** Opens (and so owns) job `jobId` on the worker, and its stage stream; the worker is reached at any of its addresses. */
  static async open(node: Libp2p, target: PeerTarget | Multiaddr, jobId: string): Promise<RemoteStage> {
    await request(node, target, { type: 'open-job', jobId });
    const stream = await dialProtocol(node, target, STAGE_PROTOCOL);
    return new RemoteStage(targetName(target), jobId, stream);
  }

  /** Sends one request (a control frame and its tensors) and waits for its answer. */
  async call(header: Record<string, unknown>, tensors: Tensor[], timeoutMs = STAGE_REQUEST_TIMEOUT_MS): Promise<Frame> {
    if (this.stream.status !== 'open') throw new PeerUnreachableError(`${this.peer}: the stage stream is ${this.stream.status}`);
    const { id, answer } = this.table.open(timeoutMs);
    try {
      await this.send(id, header, tensors.map((t) => toWire(t, id)));
    } catch (cause) {
      this.table.reject(id, new PeerUnreachableError(`${this.peer}: cannot send on the stage stream`, { cause }));
    }
    return answer;
  }

  /** Sends one request: its header (with id, job and tensor count) and its tensors, nothing in between. */
  private async send(id: number, header: Record<string, unknown>, tensors: WireTensor[], signal?: AbortSignal): Promise<void> {
    const parts = tensors.flatMap((t) => encodeTensor(t));
    await sendMessage(this.stream, [encodeControl({ ...header, id, jobId: this.jobId, tensors: tensors.length }), ...parts], { signal });
  }

  /**
   * Sends a forward that travels on along `route` (the peer ids of the later stages, all in the
   * job's assignment); the last stage delivers the output to this user's result inbox under
   * `requestId`. Nothing comes back on this stream.
   */
  async forwardChained(sessionId: string, tensors: Tensor[], route: string[], requestId: number): Promise<void> {
    const id = this.table.unanswered();
    await this.send(id, { type: 'forward', sessionId, route, replyTo: { requestId } }, tensors.map((t) => toWire(t, id))).catch((cause: unknown) => {
      throw new PeerUnreachableError(`${this.peer}: cannot send on the stage stream`, { cause });
    });
  }

  /**
   * Builds a section on the worker: sends the manifest (each weight as the sha256 addresses of
   * its chunks), then only the chunks the worker lacks (it may hold them from an earlier job, a
   * load broken off, or its disk), each hash-checked on arrival. `upstream` (the previous stage
   * of a chain, by peer id) may pass activations on to this one. Returns how many chunks went.
   */
  async load(
    config: Record<string, unknown>,
    section: [number, number],
    weights: Map<string, Tensor>,
    upstream?: string,
    options: LoadOptions = {},
  ): Promise<{ chunksSent: number; chunks: number }> {
    const chunks = new Map<string, Uint8Array>();
    const manifest = [...weights].map(([name, t]) => {
      const parts = chunksOf(t);
      for (const c of parts) chunks.set(c.sha, c.bytes);
      return { name, shape: [...t.shape], chunks: parts.map((c) => c.sha) };
    });
    const extra = { ...(upstream ? { upstream } : {}), ...(options.assignment ? { assignment: options.assignment } : {}) };
    const answer = await this.call({ type: 'load', config, section, weights: manifest, ...extra }, []);
    const need = parseNeedAnswer(controlAnswer(answer, 'load'), new Set(chunks.keys()));
    let sent = 0;
    for (const sha of need) {
      // a load stopped here resumes later: the worker keeps the chunks that arrived
      if (options.signal?.aborted) throw new PeerUnreachableError(`the load of section [${section}) was stopped after ${sent} of ${need.length} chunks`);
      const bytes = chunks.get(sha)!;
      const id = this.table.unanswered();
      await this.send(id, { type: 'chunk', sha }, [{ requestId: id, dtype: 'float32', shape: [bytes.length / 4], bytes }], options.signal);
      options.onChunk?.(++sent, need.length);
    }
    await this.call({ type: 'assemble' }, []);
    return { chunksSent: need.length, chunks: chunks.size };
  }

  /** Runs the section for one session (the worker keeps its KV cache). */
  async forward(sessionId: string, input: Tensor, positions: Tensor, keyMask: Tensor | null): Promise<Tensor> {
    const frame = await this.call({ type: 'forward', sessionId }, keyMask ? [input, positions, keyMask] : [input, positions]);
    return tensorAnswer(frame, 'forward');
  }

  async closeSession(sessionId: string): Promise<void> {
    await this.call({ type: 'close', sessionId }, []);
  }

  async close(): Promise<void> {
    await this.stream.close().catch(() => {});
  }
}
