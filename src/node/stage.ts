import type { Libp2p, PeerId, Stream } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { DIAL_TIMEOUT_MS } from '../p2p/constants.ts';
import { InvalidArgumentError, InvalidMessageError, TensorLinkError } from '../errors.ts';
import { configFromHF, createModel, type CausalLM, KVCache } from '../models/index.ts';
import { encodeControl, encodeTensor, type Frame, type WireTensor } from '../p2p/frames.ts';
import { receiveFrames, sendMessage } from '../p2p/stream.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { ChunkStore, parseWeightEntry, type WeightEntry } from './chunks.ts';
import type { JobTable } from './jobs.ts';
import { handleTraining, newWorkCounters, type Training, TRAINING_REQUESTS, type WorkCounters } from './stage-train.ts';
import { obj } from './vocabulary.ts';
import { fromWire, toWire } from './wire-tensor.ts';

/**
 * The stage protocol: a job's owner loads a section of a model onto a worker and runs
 * it, one long-lived stream per job. A request is a control frame {id, type, ...} followed
 * by the tensor frames it announces (requestId = id); answers carry the same id.
 *   load:    {jobId, config (HF config.json), section: [start, end], weights: [{name, shape, chunks}]}
 *            → {chunks: the sha256 addresses the worker lacks}; the section must fit the memory offered.
 *   chunk:   {jobId, sha} + its bytes (hash-checked, kept in the worker's chunk store; no answer).
 *   assemble:{jobId} → {params} once every chunk is there: the section is built.
 *   forward: {jobId, sessionId, tensors: 2|3} + input (ids or hidden), positions, [key mask];
 *            the worker keeps the session's KV cache and answers with the output tensor.
 *   close:   {jobId, sessionId} frees the session's cache.
 * Training requests on a loaded section are in stage-train.ts. A job ends, and its memory is
 * freed, when the stream its section was loaded over closes.
 */
export const STAGE_PROTOCOL = '/tensorlink/stage/1.0.0';
/**
 * Chained forwards: a forward may carry `route` (the addresses of the stages after this one)
 * and `replyTo` ({addr, requestId}: the user). Each worker passes its output straight to the
 * next stage; the last sends it to the user on this protocol. Errors go to the user too.
 */
export const RESULT_PROTOCOL = '/tensorlink/result/1.0.0';

/** Sessions a job may keep open on a worker. */
export const MAX_SESSIONS_PER_JOB = 256;
/** A session unused for this long is freed: its user has vanished (a decoding step is milliseconds). */
export const SESSION_IDLE_MS = 60_000;

interface Pending {
  header: Record<string, unknown>;
  expected: number;
  tensors: WireTensor[];
}

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

export async function serveStages(node: Libp2p, jobs: JobTable, memoryBytes: number, store = new ChunkStore()): Promise<StageServer> {
  /** Sections whose manifest arrived and whose chunks are arriving. */
  const loading = new Map<string, { model: CausalLM; entries: WeightEntry[]; upstream?: string }>();
  const sections = new Map<string, { model: CausalLM; sessions: Map<string, { cache: KVCache; lastUsed: number }>; training?: Training }>();
  const work = newWorkCounters();
  let gradsId = 0;
  const sendGrads = async (addr: string, header: Record<string, unknown>, grads: Tensor[]) => {
    const id = ++gradsId;
    const peer = await streamTo(addr, STAGE_PROTOCOL);
    const parts = grads.flatMap((t) => encodeTensor(toWire(t, id)));
    await sendMessage(peer, [encodeControl({ ...header, id, tensors: grads.length }), ...parts]);
  };
  /** Long-lived outgoing streams (to the next stage or to a user), one per protocol and address. */
  const outgoing = new Map<string, Promise<Stream>>();
  const streamTo = (addr: string, protocol: string): Promise<Stream> => {
    const key = `${protocol} ${addr}`;
    let s = outgoing.get(key);
    if (!s) {
      s = node.dialProtocol(multiaddr(addr), protocol, { signal: AbortSignal.timeout(DIAL_TIMEOUT_MS) });
      outgoing.set(key, s);
      s.then((st) => st.addEventListener('close', () => outgoing.delete(key))).catch(() => outgoing.delete(key));
    }
    return s;
  };
  await node.handle(STAGE_PROTOCOL, (stream: Stream, connection) => {
    const from = connection.remotePeer;
    let pending: Pending | null = null;
    // the jobs loaded over this stream end with it: their sections, caches, training state and
    // half-finished loads are freed (chunks already received stay in the store)
    const loadedHere = new Set<string>();
    const end = () => {
      for (const jobId of loadedHere) {
        loading.delete(jobId);
        sections.delete(jobId);
        jobs.remove(jobId);
      }
      loadedHere.clear();
    };
    stream.addEventListener('close', end);
    // the owner closing its side ends the job too (it sends nothing more)
    stream.addEventListener('remoteCloseWrite', () => {
      end();
      stream.close().catch(() => {});
    });
    const fail = (id: unknown, err: unknown) => {
      const e = err instanceof TensorLinkError ? err : new TensorLinkError((err as Error).message);
      try {
        stream.send(encodeControl({ id, type: 'error', error: e.name, message: e.message }));
      } catch {
        // stream gone
      }
    };
    const run = async (p: Pending) => {
      const { header } = p;
      try {
        const reply = await handle(header, p.tensors, from);
        if (reply.kind === 'tensor') await sendMessage(stream, encodeTensor(reply.tensor));
        else if (reply.kind === 'control') stream.send(encodeControl({ ...reply.message, id: header.id }));
      } catch (err) {
        // in a chain the user is waiting, not the previous stage: tell the user
        let replyTo: { addr: string; requestId: number } | null = null;
        try {
          replyTo = header.replyTo === undefined ? null : parseReplyTo(header.replyTo);
        } catch {
          replyTo = null;
        }
        if (replyTo) {
          const e = err instanceof TensorLinkError ? err : new TensorLinkError((err as Error).message);
          streamTo(replyTo.addr, RESULT_PROTOCOL)
            .then((u) => u.send(encodeControl({ id: replyTo.requestId, type: 'error', error: e.name, message: e.message })))
            .catch(() => {});
        } else fail(header.id, err);
      }
    };
    const handle = async (
      h: Record<string, unknown>,
      tensors: WireTensor[],
      peer: PeerId,
    ): Promise<{ kind: 'tensor'; tensor: WireTensor } | { kind: 'control'; message: Record<string, unknown> } | { kind: 'none' }> => {
      const job = jobs.authorize(h.jobId, peer, { delegates: h.type === 'forward' || h.type === 'grads' });
      if (h.type === 'load') {
        // the manifest: which weights, in which chunks; the worker answers with the chunks it lacks
        const config = configFromHF(obj(h.config, 'config'));
        const range = h.section;
        if (!Array.isArray(range) || range.length !== 2 || !range.every(Number.isInteger)) throw new InvalidMessageError('section must be [start, end]');
        const model = createModel(config, { section: [range[0], range[1]] });
        const own = model.hfStateDict();
        let bytes = 0;
        for (const t of own.values()) bytes += t.size * 4;
        if (bytes > memoryBytes) throw new InvalidArgumentError(`the section needs ${bytes} bytes, this worker offers ${memoryBytes}`);
        if (!Array.isArray(h.weights) || h.weights.length !== own.size) throw new InvalidMessageError(`the manifest must list the section's ${own.size} weights`);
        const entries = h.weights.map(parseWeightEntry);
        for (const e of entries) {
          const t = own.get(e.name);
          if (!t) throw new InvalidMessageError(`'${e.name}' is not a weight of this section`);
          if (t.shape.length !== e.shape.length || t.shape.some((d, i) => d !== e.shape[i])) {
            throw new InvalidMessageError(`'${e.name}' has shape [${t.shape}] in this section, the manifest says [${e.shape}]`);
          }
        }
        if (h.upstream !== undefined && (typeof h.upstream !== 'string' || h.upstream.length > 128)) throw new InvalidMessageError('upstream must be a peer id');
        loading.set(job.jobId, { model, entries, upstream: h.upstream as string | undefined });
        loadedHere.add(job.jobId);
        return { kind: 'control', message: { type: 'need', chunks: store.missing(entries) } };
      }
      if (h.type === 'chunk') {
        if (typeof h.sha !== 'string' || tensors.length !== 1) throw new InvalidMessageError('a chunk is {sha} and its bytes');
        const pending = loading.get(job.jobId);
        if (!pending) throw new InvalidMessageError(`job ${job.jobId} is not loading a section`);
        // only chunks the manifest lists are taken: a peer cannot fill the store with anything else
        if (!pending.entries.some((e) => e.chunks.includes(h.sha as string))) throw new InvalidMessageError('a chunk the manifest does not list');
        store.put(h.sha, tensors[0].bytes);
        return { kind: 'none' };
      }
      if (h.type === 'assemble') {
        const pending = loading.get(job.jobId);
        if (!pending) throw new InvalidMessageError(`job ${job.jobId} is not loading a section`);
        const missing = store.missing(pending.entries);
        if (missing.length > 0) throw new InvalidMessageError(`${missing.length} chunks of the section have not arrived (the first: ${missing[0].slice(0, 12)}…)`);
        pending.model.loadStateDict(new Map(pending.entries.map((e) => [e.name, store.assemble(e)])));
        loading.delete(job.jobId);
        // chunks another load still waits for stay (two jobs may share weights)
        const wanted = new Set([...loading.values()].flatMap((l) => l.entries.flatMap((e) => e.chunks)));
        store.release(pending.entries.flatMap((e) => e.chunks).filter((sha) => !wanted.has(sha)));
        sections.set(job.jobId, { model: pending.model, sessions: new Map() });
        // the previous stage of a chain may pass activations on for this job
        if (pending.upstream) job.delegates.add(pending.upstream);
        return { kind: 'control', message: { type: 'loaded', params: pending.model.numParameters() } };
      }
      const section = sections.get(job.jobId);
      if (!section) throw new InvalidMessageError(`job ${job.jobId} has no section loaded`);
      if (TRAINING_REQUESTS.has(String(h.type))) {
        const r = await handleTraining(h, tensors, job, section, { memoryBytes, work, sendGrads });
        return r.kind === 'tensor' ? { kind: 'tensor', tensor: toWire(r.tensor, h.id as number) } : r;
      }
      const sessionId = h.sessionId;
      if (typeof sessionId !== 'string' || sessionId.length > 64) throw new InvalidMessageError('sessionId must be a short string');
      if (h.type === 'close') {
        section.sessions.delete(sessionId);
        return { kind: 'control', message: { type: 'closed' } };
      }
      if (h.type === 'forward') {
        let session = section.sessions.get(sessionId);
        if (!session) {
          if (section.sessions.size >= MAX_SESSIONS_PER_JOB) throw new InvalidArgumentError(`job ${job.jobId} has ${MAX_SESSIONS_PER_JOB} sessions open`);
          session = { cache: new KVCache(section.model.config.layers), lastUsed: Date.now() };
          section.sessions.set(sessionId, session);
        }
        session.lastUsed = Date.now();
        const cache = session.cache;
        const [input, positions, keyMask] = tensors.map(fromWire);
        const out = noGrad(() => section.model.forward(input, { cache, positions, keyMask: keyMask ?? null }));
        work.forwards++;
        if (h.replyTo === undefined) return { kind: 'tensor', tensor: toWire(out, h.id as number) };
        const replyTo = parseReplyTo(h.replyTo);
        const route = parseRoute(h.route);
        if (route.length > 0) {
          const next = await streamTo(route[0], STAGE_PROTOCOL);
          const id = h.id as number;
          const forwarded = keyMask ? [out, positions, keyMask] : [out, positions];
          const parts = forwarded.flatMap((t) => encodeTensor(toWire(t, id)));
          await sendMessage(next, [encodeControl({ ...h, route: route.slice(1) }), ...parts]);
        } else {
          const user = await streamTo(replyTo.addr, RESULT_PROTOCOL);
          await sendMessage(user, encodeTensor(toWire(out, replyTo.requestId)));
        }
        return { kind: 'none' };
      }
      throw new InvalidMessageError(`unknown stage request '${String(h.type)}'`);
    };
    receiveFrames(stream, (frame: Frame) => {
      if (frame.kind === 'control') {
        try {
          const header = obj(frame.message, 'request');
          if (typeof header.id !== 'number') throw new InvalidMessageError('request id must be a number');
          const expected = Number(header.tensors ?? 0);
          if (!Number.isInteger(expected) || expected < 0 || expected > 4096) throw new InvalidMessageError('bad tensor count');
          pending = { header, expected, tensors: [] };
          if (expected === 0) {
            const p = pending;
            pending = null;
            void run(p);
          }
        } catch (err) {
          fail((frame.message as { id?: unknown })?.id ?? null, err);
        }
        return;
      }
      const p = pending;
      if (!p || frame.tensor.requestId !== p.header.id) {
        fail(frame.tensor.requestId, new InvalidMessageError('a tensor arrived without its request'));
        return;
      }
      p.tensors.push(frame.tensor);
      if (p.tensors.length === p.expected) {
        pending = null;
        void run(p);
      }
    });
  });
  return {
    sweep: (idleMs = SESSION_IDLE_MS) => {
      const now = Date.now();
      let freed = 0;
      for (const section of sections.values()) {
        for (const [id, session] of section.sessions) {
          if (now - session.lastUsed > idleMs) {
            section.sessions.delete(id);
            freed++;
          }
        }
      }
      return freed;
    },
    sessions: () => [...sections.values()].reduce((n, s) => n + s.sessions.size, 0),
    jobs: () => sections.size,
    work: () => ({ ...work }),
  };
}

function parseReplyTo(v: unknown): { addr: string; requestId: number } {
  const o = obj(v, 'replyTo');
  if (typeof o.addr !== 'string' || o.addr.length > 512 || !Number.isInteger(o.requestId)) {
    throw new InvalidMessageError('replyTo must be {addr, requestId}');
  }
  return { addr: o.addr, requestId: o.requestId as number };
}

function parseRoute(v: unknown): string[] {
  if (v === undefined) return [];
  if (!Array.isArray(v) || v.length > 64 || !v.every((a) => typeof a === 'string' && a.length <= 512)) {
    throw new InvalidMessageError('route must be a list of addresses');
  }
  return v as string[];
}
