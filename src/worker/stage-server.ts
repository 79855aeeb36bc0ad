import type { Libp2p, PeerId, Stream } from '@libp2p/interface';
import {
  type ArrivalMark, ArrivalMeter, encodeControl, encodeTensor, errorToWire, type Frame, MAX_STAGE_STREAMS, newWorkCounters,
  parseStageEnvelope, PeerRateLimiter, receiveFrames, replyToOf, RESULT_PROTOCOL, SEND_STALL_MS, sendMessage, sendQuietly,
  SESSION_IDLE_MS, STAGE_MESSAGES_PER_SECOND, STAGE_PROTOCOL, type StageEnvelope, toWire, type TransferSample, type WireTensor,
  type WorkCounters,
} from '../p2p/index.ts';
import { InvalidMessageError, RateLimitedError } from '../errors.ts';
import type { RecordSigner } from '../verify/index.ts';
import { ChunkStore } from './chunk-store.ts';
import type { FaultInjector } from './fault.ts';
import { auditHandlers } from './handlers/audit.ts';
import { disputeHandlers } from './handlers/dispute.ts';
import { inferenceHandlers } from './handlers/infer.ts';
import { loadHandlers } from './handlers/load.ts';
import { trainingHandlers } from './handlers/train.ts';
import type { StageContext, StageHandler } from './handlers/types.ts';
import { hostedRequest } from './hosting.ts';
import { countSent, type JobEntry, type JobTable } from './jobs.ts';
import type { MemoryBudget } from './memory.ts';
import type { ModelIndex } from './model-index.ts';
import { PeerStreams } from './peer-streams.ts';
import { countBackendCopies } from './release.ts';

/** What a tensor answer carries, for the job's traffic: weights, a verifier's evidence, or (any other) activations. */
const ANSWER_TRAFFIC: Record<string, 'weights' | 'audits'> = {
  'weight': 'weights', 'moments': 'weights', 'trial-delta': 'weights', 'audit-part': 'audits', 'dispute-value': 'audits',
};

/** Every stage request type and its handler: the one dispatch table of the stage protocol. */
const HANDLERS: Record<string, StageHandler> = {
  ...loadHandlers, ...inferenceHandlers, ...trainingHandlers, ...auditHandlers, ...disputeHandlers,
};

export interface StageServer {
  /** Frees sessions idle for longer than `idleMs`; returns how many were freed. */
  sweep(idleMs?: number): number;
  /** Open sessions across all jobs. */
  sessions(): number;
  /** Jobs with a section loaded (freed when their owner's stage stream closes). */
  jobs(): number;
  /** What it has computed so far. */
  work(): WorkCounters;
}

export interface StageServerOptions {
  memory: MemoryBudget;
  store?: ChunkStore;
  models?: ModelIndex | null;
  /** How long a send waits for a peer that takes no bytes before its stream is reset (default SEND_STALL_MS). */
  stallMs?: number;
  signer: RecordSigner;
  fault?: FaultInjector | null;
  /** Called with each request whose tensors were enough bytes to time as they arrived (passive measurement, see passive.ts). */
  onTransfer?: (peerId: string, sample: TransferSample) => void;
  /** Stage requests a peer may send per second, in bursts of as many (default STAGE_MESSAGES_PER_SECOND). */
  requestsPerSecond?: number;
}

/** A request whose tensors are still arriving, with what its header was admitted as, or why it was refused (its tensors dropped). */
interface Pending {
  envelope: StageEnvelope;
  tensors: WireTensor[];
  admitted: { handler: StageHandler; job: JobEntry } | Error;
  /** When its header arrived, to time its tensors' arrival. */
  arrival: ArrivalMark;
}

/**
 * Serves the stage protocol: frames become requests (a control header and the tensors it
 * announces), each peer within its rate, each request authorized against the job table and
 * dispatched through HANDLERS. A bad request gets a typed error answer (for a chained
 * forward, at the job's owner) and the worker goes on serving; a broken frame resets only
 * its stream. Jobs end with the stream they were loaded over, or when their owner disconnects.
 */
export async function serveStages(node: Libp2p, jobs: JobTable, options: StageServerOptions): Promise<StageServer> {
  const context: StageContext = {
    jobs,
    store: options.store ?? new ChunkStore(),
    models: options.models ?? null,
    memory: options.memory,
    work: newWorkCounters(),
    peers: new PeerStreams(node),
    stallMs: options.stallMs ?? SEND_STALL_MS,
    signer: options.signer,
    fault: options.fault ?? null,
  };
  const rate = options.requestsPerSecond ?? STAGE_MESSAGES_PER_SECOND;
  const limiter = new PeerRateLimiter(rate);
  node.addEventListener('peer:disconnect', (evt) => {
    const peer = evt.detail.toString();
    limiter.forget(peer);
    jobs.removeOwnedBy(peer);
  });
  const onTransfer = options.onTransfer ?? null;
  const limit = { limiter, rate };
  await node.handle(STAGE_PROTOCOL, (stream, connection) => serveStream(stream, connection.remotePeer, context, limit, onTransfer), {
    maxInboundStreams: MAX_STAGE_STREAMS,
  });
  const sections = () => [...jobs.values()].flatMap((j) => (j.section ? [j.section] : []));
  return {
    sweep: (idleMs = SESSION_IDLE_MS) => {
      const now = Date.now();
      let freed = 0;
      for (const job of jobs.values()) {
        for (const [id, session] of job.section?.sessions ?? []) {
          if (now - session.lastUsed <= idleMs) continue;
          jobs.dropSession(job, id, context.memory);
          freed++;
        }
      }
      return freed;
    },
    sessions: () => sections().reduce((n, s) => n + s.sessions.size, 0),
    jobs: () => sections().length,
    work: () => ({ ...context.work }),
  };
}

function serveStream(
  stream: Stream,
  from: PeerId,
  context: StageContext,
  { limiter, rate }: { limiter: PeerRateLimiter; rate: number },
  onTransfer: ((peerId: string, sample: TransferSample) => void) | null,
): void {
  const { jobs, stallMs } = context;
  // every arrival is counted before its frames are decoded: a request's tensors are timed from its header on
  const meter = new ArrivalMeter();
  stream.addEventListener('message', (evt) => meter.arrived(evt.data.byteLength));
  let pending: Pending | null = null;
  // the jobs loaded over this stream end with it: their sections, caches, training state and
  // half-finished loads are freed (chunks already received stay in the store)
  const bound = new Set<string>();
  const end = () => {
    for (const jobId of bound) jobs.remove(jobId);
    bound.clear();
  };
  stream.addEventListener('close', end);
  // the owner closing its side ends the job too (it sends nothing more)
  stream.addEventListener('remoteCloseWrite', () => {
    end();
    stream.close().catch(() => {});
  });
  const answerError = (id: unknown, err: unknown) => sendQuietly(stream, [encodeControl({ ...errorToWire(err), id })], { stallMs });
  /** Decided when the header arrives, before any of its tensors: within the rate, a known type, its tensor count, its job. */
  const admit = (envelope: StageEnvelope): Pending['admitted'] => {
    try {
      if (!limiter.allow(from.toString())) throw new RateLimitedError(`more than ${rate} stage requests per second`);
      const handler = handlerOf(envelope.type);
      const max = handler.maxTensors ?? 0;
      if (envelope.tensors > max) throw new InvalidMessageError(`${envelope.type} carries at most ${max} tensors, the request announces ${envelope.tensors}`);
      const job = jobs.authorize(envelope.jobId, from, { delegates: handler.delegates === true, verifiers: handler.verifiers === true });
      return { handler, job };
    } catch (err) {
      return err as Error;
    }
  };
  const run = async (p: Pending) => {
    const { envelope, admitted } = p;
    try {
      if (admitted instanceof Error) throw admitted;
      const { handler, job } = admitted;
      // the job may have ended while the request's tensors were arriving: nothing may run on (or be counted for) what it held
      if (!jobs.holds(job)) throw new InvalidMessageError(`job ${job.jobId} ended before the request's tensors had all arrived`);
      const bindToStream = () => bound.add(job.jobId);
      // on a hosted span, only session requests, each on the sender's own sessions
      const body = job.hosted ? hostedRequest(envelope.type, envelope.body, from.toString(), job.verifiers) : envelope.body;
      const request = { id: envelope.id, type: envelope.type, body, tensors: p.tensors, job, from, bindToStream };
      const reply = await handler.run(request, context);
      // what the backend made for the job's compact weights while it ran is counted in its budget (a job that ended
      // meanwhile has returned all it held, and is not counted again)
      if (jobs.holds(job)) countBackendCopies(job, context.memory);
      if (reply.kind === 'tensor') {
        // a result's record travels just before it, under the same id
        const cut = reply.cut ? { cut: reply.cut } : {};
        const record = reply.record ? [encodeControl({ type: 'record', id: envelope.id, record: reply.record, ...cut })] : [];
        const [head, payload] = encodeTensor(reply.part ? { requestId: envelope.id, ...reply.part } : toWire(reply.tensor, envelope.id));
        countSent(job, Object.hasOwn(ANSWER_TRAFFIC, envelope.type) ? ANSWER_TRAFFIC[envelope.type] : 'activations', [...record, head], [payload]);
        await sendMessage(stream, [...record, head, payload], { stallMs });
      } else if (reply.kind === 'control') {
        const frame = encodeControl({ ...reply.message, id: envelope.id });
        countSent(job, 'control', [frame]);
        await sendMessage(stream, [frame], { stallMs });
      }
    } catch (err) {
      // in a chain the job's owner is waiting, not the previous stage: tell the owner
      const replyTo = envelope.type === 'forward' ? replyToOf(envelope.body) : null;
      const owner = admitted instanceof Error || admitted.job.hosted ? null : admitted.job.owner;
      if (replyTo && owner) {
        context.peers
          .to({ peerId: owner, addrs: [] }, RESULT_PROTOCOL)
          .then((owner) => sendQuietly(owner, [encodeControl({ ...errorToWire(err), id: replyTo.requestId })], { stallMs }))
          .catch(() => {});
      } else answerError(envelope.id, err);
    }
  };
  receiveFrames(stream, (frame: Frame) => {
    if (frame.kind === 'control') {
      if (pending) answerError(pending.envelope.id, new InvalidMessageError(`request ${pending.envelope.id} was abandoned: ${pending.envelope.tensors - pending.tensors.length} of its tensors had not arrived when the next request came`));
      pending = null;
      let envelope: StageEnvelope;
      try {
        envelope = parseStageEnvelope(frame.message);
      } catch (err) {
        answerError((frame.message as { id?: unknown } | null)?.id ?? null, err);
        return;
      }
      const p: Pending = { envelope, tensors: [], admitted: admit(envelope), arrival: meter.mark(performance.now()) };
      if (envelope.tensors === 0) void run(p);
      else pending = p;
      return;
    }
    const p = pending;
    if (!p || frame.tensor.requestId !== p.envelope.id) {
      answerError(frame.tensor.requestId, new InvalidMessageError('a tensor arrived without its request'));
      return;
    }
    if (!(p.admitted instanceof Error)) p.tensors.push(frame.tensor);
    else p.tensors.push({ ...frame.tensor, bytes: new Uint8Array(0) }); // counted, not kept
    if (p.tensors.length === p.envelope.tensors) {
      pending = null;
      const sample = onTransfer ? meter.sample(p.arrival, performance.now()) : null;
      if (sample) onTransfer!(from.toString(), sample);
      void run(p);
    }
  });
}

function handlerOf(type: string): StageHandler {
  const handler = Object.hasOwn(HANDLERS, type) ? HANDLERS[type] : undefined;
  if (!handler) throw new InvalidMessageError(`unknown stage request '${type}'`);
  return handler;
}
