import type { Libp2p, Stream } from '@libp2p/interface';
import type { Multiaddr } from '@multiformats/multiaddr';
import { InvalidMessageError, PeerUnreachableError } from '../errors.ts';
import {
  dialProtocol, encodeControl, encodeTensor, errorFromWire, type Frame, fromWire, isWireError,
  parseLoadedAnswer, parseNeedAnswer, type PeerTarget, receiveFrames, RequestTable, request, sendMessage, STAGE_PROTOCOL,
  STAGE_REQUEST_TIMEOUT_MS, TRAIN_REQUEST_TIMEOUT_MS,
  type SectionFormat, type StageAssignment, targetName, toWire, type Traffic, newTraffic, type WireActivationCodec, type WireAdapter,
  type WireTensor,
} from '../p2p/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { hopIn, hopOut } from '../compress/index.ts';
import { hashTensors, type WorkRecord } from '../verify/index.ts';
import type { SectionSource } from './section-source.ts';

/** Requests whose tensors are weights or optimizer state (the others carry activations). */
const WEIGHT_REQUESTS = new Set(['chunk', 'set-moments']);

/** The control answer of a request (a typed error when a tensor came instead). */
export function controlAnswer(frame: Frame, what: string): Record<string, unknown> {
  if (frame.kind !== 'control' || typeof frame.message !== 'object' || frame.message === null) throw new InvalidMessageError(`${what}: expected a control answer`);
  return frame.message as Record<string, unknown>;
}

/** An answer with the signed record a worker sent with it (parsed by its receiver, untrusted until then). */
export type RecordedFrame = Frame & { record?: unknown; cut?: unknown };

/** The record that came with an answer: beside a tensor, or inside a control answer. */
export function recordOf(frame: RecordedFrame): unknown {
  if (frame.kind === 'tensor') return frame.record;
  return (frame.message as { record?: unknown } | null)?.record;
}

/** The tensor answer of a request (a typed error when a control message came instead). */
export function tensorAnswer(frame: Frame, what: string): Tensor {
  if (frame.kind !== 'tensor') throw new InvalidMessageError(`${what}: expected a tensor`);
  return fromWire(frame.tensor);
}

/**
 * What a record must name for a hop's result that came back: with a codec, what the worker sent
 * (`sent`, the hash of the decoded tensor; its exact output is for re-execution), else its output.
 */
export function cameBack(codec: WireActivationCodec | null, hash: string): { output: string } | { sent: string } {
  return codec ? { sent: hash } : { output: hash };
}

/** The hash of what the next stage of a chain computes on: with a codec, what this stage's record says it sent. */
export function passedOn(codec: WireActivationCodec | null, record: WorkRecord): string {
  return codec ? record.sent ?? '' : record.output;
}

/** How far a section's load has come. */
export interface LoadProgress {
  /** Bytes of the section settled: sent, or found on the worker. */
  done: number;
  /** Bytes sent over the network so far. */
  sent: number;
  /** Bytes of the whole section. */
  total: number;
  /** Chunks sent so far. */
  chunks: number;
}

/** Options of a section's load. */
export interface LoadOptions {
  /** The previous stage of a chain (a peer id): it may pass activations on to this one. */
  upstream?: string;
  /** Every section of the job: the only peers this worker may send the job's activations and gradients to. */
  assignment?: StageAssignment[];
  signal?: AbortSignal;
  /** Peers (validators) that may fetch what re-running this section's records needs. */
  verifiers?: string[];
  /** Called after each manifest and each chunk. */
  onProgress?: (progress: LoadProgress) => void;
  /** The compact format the worker holds the section's matrices in once they arrive (absent: float32). */
  format?: SectionFormat;
  /** A LoRA adapter on the section (its factors are among the source's weights): the base frozen on the worker. */
  adapter?: WireAdapter;
  /** The hash of a model the worker hosts: the section shares its blocks, and the source holds only the adapter's factors. */
  base?: string;
}

/** What a load moved: chunks sent of the distinct chunks listed, and bytes sent and found on the worker. */
export interface LoadResult {
  chunksSent: number;
  chunks: number;
  bytesSent: number;
  bytesReused: number;
}

/**
 * The user's handle on one section of a job on one worker: one long-lived stream, requests
 * matched to answers by id, errors arriving as the typed errors the worker named.
 */
export class RemoteStage {
  private readonly table: RequestTable<RecordedFrame>;
  /** Bytes this user sent on the stage stream, by kind (the worker counts what it sends). */
  readonly traffic: Traffic = newTraffic();
  /**
   * How hidden states travel to and from this worker, in training and in sessions (null: float32):
   * a training job's `compressActivations` sets it on every stage.
   */
  codec: WireActivationCodec | null = null;

  private constructor(
    readonly peer: string,
    readonly jobId: string,
    private readonly stream: Stream,
  ) {
    this.table = new RequestTable(peer);
    // a result's signed record arrives just before it, under its id: kept until the result comes
    const records = new Map<unknown, { record?: unknown; cut?: unknown }>();
    receiveFrames(stream, (frame) => {
      const id = frame.kind === 'tensor' ? frame.tensor.requestId : (frame.message as { id?: unknown } | null)?.id;
      if (frame.kind === 'control' && isWireError(frame.message)) this.table.reject(id, errorFromWire(frame.message, peer));
      else if (frame.kind === 'control' && (frame.message as { type?: unknown }).type === 'record') {
        // a record whose result never came (a timeout) must not hold a slot for ever: the oldest goes
        if (records.size >= 1024) records.delete(records.keys().next().value);
        const { record, cut } = frame.message as { record?: unknown; cut?: unknown };
        records.set(id, { record, cut });
      } else if (frame.kind === 'tensor') {
        const came = records.get(id);
        records.delete(id);
        const cut = came?.cut === undefined ? {} : { cut: came.cut };
        this.table.resolve(id, came === undefined ? frame : { ...frame, record: came.record, ...cut });
      } else this.table.resolve(id, frame);
    });
    stream.addEventListener('close', () => this.table.rejectAll(new PeerUnreachableError(`${peer} closed the stage stream`)));
  }

  /** Opens (and so owns) job `jobId` on the worker, and its stage stream; the worker is reached at any of its addresses. */
  static async open(node: Libp2p, target: PeerTarget | Multiaddr, jobId: string): Promise<RemoteStage> {
    await request(node, target, { type: 'open-job', jobId });
    const stream = await dialProtocol(node, target, STAGE_PROTOCOL);
    return new RemoteStage(targetName(target), jobId, stream);
  }

  /** A stage stream to a hosted span (`worker --host`): no job is opened, the worker's own hosted job is used. */
  static async attach(node: Libp2p, target: PeerTarget | Multiaddr, jobId: string): Promise<RemoteStage> {
    const stream = await dialProtocol(node, target, STAGE_PROTOCOL);
    return new RemoteStage(targetName(target), jobId, stream);
  }

  /** Whether its stage stream is still open (a worker that died or closed it is not). */
  get open(): boolean {
    return this.stream.status === 'open';
  }

  /**
   * Sends one request (a control frame and its tensors) and waits for its answer. The tensors
   * go as float32 frames, or as the frames `tensors` makes for the request's id (an encoding).
   */
  async call(
    header: Record<string, unknown>,
    tensors: Tensor[] | ((id: number) => WireTensor[]),
    timeoutMs = STAGE_REQUEST_TIMEOUT_MS,
  ): Promise<RecordedFrame> {
    if (this.stream.status !== 'open') throw new PeerUnreachableError(`${this.peer}: the stage stream is ${this.stream.status}`);
    const { id, answer } = this.table.open(timeoutMs);
    try {
      await this.send(id, header, typeof tensors === 'function' ? tensors(id) : tensors.map((t) => toWire(t, id)));
    } catch (cause) {
      this.table.reject(id, new PeerUnreachableError(`${this.peer}: cannot send on the stage stream`, { cause }));
    }
    return answer;
  }

  /** Sends one request: its header (with id, job and tensor count) and its tensors, nothing in between. */
  private async send(id: number, header: Record<string, unknown>, tensors: WireTensor[], signal?: AbortSignal): Promise<void> {
    const frames = tensors.map((t) => encodeTensor(t));
    const head = encodeControl({ ...header, id, jobId: this.jobId, tensors: tensors.length });
    this.traffic.control += head.byteLength;
    const kind = WEIGHT_REQUESTS.has(String(header.type)) ? 'weights' : 'activations';
    for (const [h, payload] of frames) {
      this.traffic.control += h.byteLength;
      this.traffic[kind] += payload.byteLength;
    }
    await sendMessage(this.stream, [head, ...frames.flat()], { signal });
  }

  /**
   * A session step's request: its header and frames, the hidden states (or ids) encoded by the
   * codec and the positions (and key mask) as they are, and the hash of the input the worker
   * computes on (what its record must name).
   */
  private sessionStep(header: Record<string, unknown>, [x, ...aux]: Tensor[]) {
    const { part, received } = hopOut(x, this.codec);
    return {
      header: { type: 'forward', ...header, ...(this.codec ? { codec: this.codec } : {}) },
      frames: (id: number) => [{ requestId: id, ...part }, ...aux.map((t) => toWire(t, id))],
      input: hashTensors([received]),
    };
  }

  /**
   * Sends a forward that travels on along `route` (the peer ids of the later stages, all in the
   * job's assignment); the last stage delivers the output to this user's result inbox under
   * `requestId`. Nothing comes back on this stream. `tensors`: the hidden states (or ids), the
   * positions and perhaps a key mask. Returns the hash of the input the first stage computes on
   * (with a codec, the hidden states as decoded) and the codec the chain's hops travel by.
   */
  async forwardChained(
    sessionId: string,
    tensors: Tensor[],
    route: string[],
    requestId: number,
  ): Promise<{ input: string; codec: WireActivationCodec | null }> {
    const id = this.table.unanswered();
    const { codec } = this;
    const { header, frames, input } = this.sessionStep({ sessionId, route, replyTo: { requestId } }, tensors);
    await this.send(id, header, frames(id)).catch((cause: unknown) => {
      throw new PeerUnreachableError(`${this.peer}: cannot send on the stage stream`, { cause });
    });
    return { input, codec };
  }

  /**
   * Builds a section on the worker from `source`: the worker reserves its memory and builds it
   * empty, then weight by weight the user sends a manifest (the sha256 of each chunk) and only
   * the chunks the worker lacks (it may hold them from an earlier job, a load broken off, or a
   * checkpoint on its disk), each hash-checked and written into place on arrival. The next
   * weight is hashed while this one's chunks are in flight; only chunks in flight are held.
   */
  async load(
    config: Record<string, unknown>,
    section: [number, number],
    source: SectionSource,
    options: LoadOptions = {},
  ): Promise<LoadResult> {
    const extra = {
      ...(options.upstream ? { upstream: options.upstream } : {}),
      ...(options.assignment ? { assignment: options.assignment } : {}),
      ...(options.verifiers?.length ? { verifiers: options.verifiers } : {}),
      ...(options.format ? { format: options.format } : {}),
      ...(options.adapter ? { adapter: options.adapter } : {}),
      ...(options.base ? { base: options.base } : {}),
    };
    await this.call({ type: 'load', config, section, ...extra }, []);
    const weights = source.weights;
    const progress: LoadProgress = { done: 0, sent: 0, total: weights.reduce((sum, w) => sum + w.bytes, 0), chunks: 0 };
    const result: LoadResult = { chunksSent: 0, chunks: 0, bytesSent: 0, bytesReused: 0 };
    const distinct = new Set<string>();
    const hashesOf = (i: number) => {
      const hashing = source.hashes(weights[i].name);
      hashing.catch(() => {}); // awaited below; a failure while an earlier weight is sending is not unhandled
      return hashing;
    };
    let next = weights.length > 0 ? hashesOf(0) : null;
    for (const [i, w] of weights.entries()) {
      const chunks = await next!;
      next = i + 1 < weights.length ? hashesOf(i + 1) : null;
      for (const sha of chunks) distinct.add(sha);
      result.chunks = distinct.size;
      // a worker reads and re-hashes the chunks it holds before it answers: a large weight takes a while
      const entry = { name: w.name, shape: w.shape, chunks, ...(w.format ? { format: w.format } : {}) };
      const answer = await this.call({ type: 'manifest', weights: [entry] }, [], TRAIN_REQUEST_TIMEOUT_MS);
      const need = parseNeedAnswer(controlAnswer(answer, 'manifest'), new Set(chunks));
      let sentHere = 0;
      for (const sha of need) {
        // a load stopped here resumes later: a worker with a data directory keeps the chunks that arrived
        if (options.signal?.aborted) throw new PeerUnreachableError(`the load of section [${section}) was stopped after ${result.chunksSent} chunks`);
        const bytes = source.chunk(w.name, chunks.indexOf(sha));
        const id = this.table.unanswered();
        // a packed matrix's bytes are not float32 values (nor a multiple of 4 bytes at bf16)
        const wire = w.format ? { dtype: 'uint8' as const, shape: [bytes.length] } : { dtype: 'float32' as const, shape: [bytes.length / 4] };
        await this.send(id, { type: 'chunk', sha }, [{ requestId: id, ...wire, bytes }], options.signal);
        result.chunksSent++;
        progress.chunks++;
        sentHere += bytes.length;
        progress.sent += bytes.length;
        progress.done += bytes.length;
        options.onProgress?.({ ...progress });
      }
      progress.done += w.bytes - sentHere;
      options.onProgress?.({ ...progress });
    }
    const loaded = parseLoadedAnswer(controlAnswer(await this.call({ type: 'assemble' }, []), 'assemble'));
    result.bytesSent = loaded.received;
    result.bytesReused = loaded.reused;
    return result;
  }

  /** Runs the section for one session (the worker keeps its KV cache). */
  async forward(sessionId: string, input: Tensor, positions: Tensor, keyMask: Tensor | null): Promise<Tensor> {
    return (await this.forwardRecorded(sessionId, input, positions, keyMask)).output;
  }

  /**
   * A session's step with the worker's signed record of it (unchecked: the caller checks it), the
   * hash of the input the worker computed on, and what its record must name for the output that
   * came (`expect`: its output, or with a codec what it sent). With `keep`, the session's last step (a speculative
   * pass) is cut to that many positions first, and `cut` is its re-signed record (unchecked too).
   */
  async forwardRecorded(
    sessionId: string,
    input: Tensor,
    positions: Tensor,
    keyMask: Tensor | null,
    timeoutMs = STAGE_REQUEST_TIMEOUT_MS,
    keep?: number,
  ): Promise<{ output: Tensor; record: unknown; cut?: unknown; input: string; expect: { output: string } | { sent: string } }> {
    const { codec } = this;
    const header = { sessionId, ...(keep === undefined ? {} : { keep }) };
    const step = this.sessionStep(header, keyMask ? [input, positions, keyMask] : [input, positions]);
    const frame: RecordedFrame = await this.call(step.header, step.frames, timeoutMs);
    if (frame.kind !== 'tensor') throw new InvalidMessageError('forward: expected a tensor');
    const output = hopIn(frame.tensor);
    const cut = keep === undefined ? {} : { cut: frame.cut };
    return { output, record: recordOf(frame), ...cut, input: step.input, expect: cameBack(codec, hashTensors([output])) };
  }

  /** One weight of the section as the worker holds it now (trained, if it trains). */
  async weight(name: string): Promise<Tensor> {
    return tensorAnswer(await this.call({ type: 'weight', name }, [], TRAIN_REQUEST_TIMEOUT_MS), 'weight');
  }

  async closeSession(sessionId: string): Promise<void> {
    await this.call({ type: 'close', sessionId }, []);
  }

  /** Keeps the first `length` positions of a session (a speculative pass's accepted ones); the record re-signed for its last step. */
  async truncateSession(sessionId: string, length: number): Promise<unknown> {
    const answer = await this.call({ type: 'truncate', sessionId, length }, []);
    if (answer.kind !== 'control') throw new InvalidMessageError(`${this.peer}: a truncate answer must be a control message`);
    return (answer.message as { record?: unknown } | null)?.record;
  }

  async close(): Promise<void> {
    await this.stream.close().catch(() => {});
  }

  /** Drops the stream at once without waiting for the worker (one found lost: there is no one to wait for). */
  abort(): void {
    try {
      this.stream.abort(new PeerUnreachableError(`${this.peer} was lost`));
    } catch {
      // already gone
    }
  }
}
