import { InvalidArgumentError, InvalidMessageError, RateLimitedError } from '../../errors.ts';
import { cutStep, deviceRunner, KVCache, type ModelLayer, prefillShared } from '../../models/index.ts';
import {
  encodeControl, encodeTensor, expectTensors, fromWire, MAX_SESSIONS_PER_JOB, MAX_SESSIONS_PER_PEER, parseForward, parseSessionId,
  RESULT_PROTOCOL, sendMessage, STAGE_PROTOCOL, toWire, type WorkCounters,
} from '../../p2p/index.ts';
import { hopIn, hopOut } from '../../compress/index.ts';
import { computeDevice, computeName, noGrad, type Tensor } from '../../tensor/index.ts';
import {
  auxHash, checkpointHash, COMMIT_CHUNK, hashTensors, type RecordSigner, recordFlops, recordId, sectionCost, signRecord, type WorkRecord,
} from '../../verify/index.ts';
import { commitStep, truncateCommits } from '../commitments.ts';
import { DecodeBatcher } from '../decode-batcher.ts';
import { countSent, type Section } from '../jobs.ts';
import { admitPages, sectionPages, syncPages } from '../kv-pages.ts';
import type { MemoryBudget } from '../memory.ts';
import { control, NONE, sectionOf, type StageHandler } from './types.ts';

/**
 * Inference on a loaded section: `forward` runs one step of a session (the worker keeps its
 * KV cache) and either answers, or passes the output on to the next stage of the job's
 * assignment, the last stage sending it to the job's owner; `close` frees a session. With a
 * codec the hidden states travel as float16 or int8 (positions and masks as they are), and the
 * record names what was sent (`sent`) beside the exact output.
 */
export const inferenceHandlers: Record<string, StageHandler> = {
  'forward': {
    delegates: true,
    maxTensors: 3,
    run: async ({ id, body, tensors, job, from }, { jobs, peers, work, stallMs, memory, fault, signer }) => {
      const request = parseForward(body);
      // a chained forward may only go to peers of the job's own assignment: the owner cannot make a worker dial anyone else
      const next = request.route.length > 0 ? jobs.peerOf(job, request.route[0]) : null;
      const section = sectionOf(job);
      // the tensors are checked before a session is made: a malformed request leaves nothing behind
      const [hidden, ...aux] = expectTensors('forward', tensors, [2, 3]);
      const input = hopIn(hidden);
      const [positions, keyMask] = aux.map(fromWire);
      let session = section.sessions.get(request.sessionId);
      if (!session) {
        if (request.keep !== undefined) throw new InvalidMessageError(`session ${request.sessionId} is not open: it has no pass to cut`);
        if (section.sessions.size >= MAX_SESSIONS_PER_JOB) throw new InvalidArgumentError(`job ${job.jobId} has ${MAX_SESSIONS_PER_JOB} sessions open`);
        // a hosted span's sessions are keyed by their user (worker/hosting.ts: hostedRequest): one user holds a share only
        const user = job.hosted ? request.sessionId.slice(0, request.sessionId.indexOf('/') + 1) : '';
        if (user && [...section.sessions.keys()].filter((k) => k.startsWith(user)).length >= MAX_SESSIONS_PER_PEER) {
          throw new RateLimitedError(`you hold ${MAX_SESSIONS_PER_PEER} sessions on this hosted model already: close one first`);
        }
        // a hosted span's sessions of one sequence keep their caches in pages, sharing the prefixes they begin with
        const paged = job.hosted !== undefined && computeDevice() === 'cpu' && (input.shape[0] ?? 1) === 1;
        const cache = new KVCache(section.model.config.layers, paged ? sectionPages(section).pool : null);
        session = { cache, lastUsed: Date.now(), kvBytes: 0, history: [], ...(job.hosted ? { peer: from.toString() } : {}) };
        // a GPU worker keeps the session's cache on its device and runs each step as one graph there
        if (computeDevice() !== 'cpu') session.device = deviceRunner(section.model, computeDevice());
        section.sessions.set(request.sessionId, session);
      }
      session.lastUsed = Date.now();
      const cache = session.cache;
      const runner = session.device;
      // a speculative pass cut to its accepted positions, asked with the step after it (no round trip of its own): the
      // step is checked and admitted as it would be after the cut, and the cut made only then
      const cached = request.keep ?? (runner ? runner.cached : cache.length);
      // positions come from the peer: the cache never grows past the model's context, whatever it says
      const steps = input.shape[1] ?? 0;
      if (cached + steps > section.model.config.maxPositions) {
        throw new InvalidArgumentError(`session ${request.sessionId} would hold ${cached + steps} positions, the model has ${section.model.config.maxPositions}`);
      }
      // the cache's growth (and the inputs kept for re-running the step) is counted before it happens:
      // a session that would pass the budget is refused. Pages are charged as the pool holds them, after the step: before
      // it, at most a page more per layer than its positions (and a new prefix's outputs) are held for it
      const pages = cache.pool ? sectionPages(section) : undefined;
      const kept = [input, positions, keyMask].reduce((sum, t) => sum + (t ? 4 * t.size : 0), 0);
      const shared = pages !== undefined && cached === 0 && !keyMask && steps > pages.pool.pageSize && fromZero(positions);
      // a page per layer it may open, and one it may copy (a cut into a shared page)
      const slack = 2 * (pages?.pool.pageSize ?? 0);
      const ahead = (input.shape[0] ?? 1) * (steps + slack) * kvBytesPerToken(section.model.layers) + (shared ? 4 * input.size : 0);
      const growth = ahead + kept;
      admitPages(pages, memory, job.jobId, growth, `the KV cache of session ${request.sessionId} (${cached + steps} positions)`);
      session.kvBytes += pages ? kept : growth;
      let cut: WorkRecord | undefined;
      try {
        if (request.keep !== undefined) cut = cutSession(section, job.jobId, request.sessionId, request.keep, memory, signer);
      } catch (err) {
        session.kvBytes -= pages ? kept : growth;
        memory.add(job.jobId, 'kv-cache', -growth, 'a refused cut');
        throw err;
      }
      let out;
      let position = cached;
      session.busy = true;
      try {
        if (fault) await fault.delay();
        // a hosted span's one-token steps run batched with its other sessions' steps waiting at the same time
        if (runner) {
          out = await runner.step(input, { positions, keyMask: keyMask ?? null });
        } else if (job.hosted && steps === 1 && input.shape[0] === 1 && !keyMask && !request.codec) {
          ({ out, position } = await batcherOf(section, work).step(input, cache, positions));
        } else if (shared) {
          // a session's first step begins with the pages of the prefix it shares with an earlier one, computes the rest
          const run = (x: Tensor, at: Tensor) => section.model.forward(x, { cache, positions: at, keyMask: null });
          out = noGrad(() => prefillShared(pages.prefix, cache, input, run));
        } else {
          out = noGrad(() => section.model.forward(input, { cache, positions, keyMask: keyMask ?? null }));
        }
        if (fault) out = fault.output('decode', out, input);
      } catch (err) {
        // a forward that failed grew nothing (pages: what they hold is charged below)
        const back = pages ? kept : growth;
        session.kvBytes -= back;
        memory.add(job.jobId, 'kv-cache', -back, 'a failed forward');
        throw err;
      } finally {
        session.busy = false;
        // a session closed while its step computed: what the step grew goes too
        if (section.sessions.get(request.sessionId) !== session) session.cache.release();
        if (pages) {
          // what was held ahead becomes what the pages hold
          memory.add(job.jobId, 'kv-cache', -ahead, 'the KV cache\'s pages');
          syncPages(pages, memory, job.jobId);
        }
      }
      work.forwards++;
      // its signed record travels with the output (along the chain, to the owner): the input it was
      // given, the output it returned, the weights it holds (hashed in checkpoint-name order)
      // encoded once: the frame that leaves, and what its receiver computes on (its hash in the record)
      const sent = hopOut(out, request.codec);
      // the chunks of positions this step closed, committed (a validator checks a sampled one by one prefill)
      const commits = commitStep(session, input, out, position);
      const stepped = { input, positions, keyMask: keyMask ?? null, out };
      const record = decodeRecord(section, job.jobId, request.sessionId, position, stepped, signer, {
        ...(request.codec ? { sent: hashTensors([sent.received]) } : {}), ...(commits ? { commits } : {}),
      });
      // a speculative pass (never more than a chunk of commitments) may be cut: its output is kept until the next step
      session.lastOutput = steps <= COMMIT_CHUNK ? out : undefined;
      // on ort its output is kept too (and counted): a verifier compares within tolerance, not by hash
      if (record.backend !== 'js') {
        memory.add(job.jobId, 'kv-cache', 4 * out.size, `the outputs kept for re-running session ${request.sessionId}`);
        session.kvBytes += 4 * out.size;
      }
      session.history.push({ input, positions, keyMask: keyMask ?? null, record, ...(record.backend === 'js' ? {} : { output: out }) });
      if (!request.replyTo) return { kind: 'tensor', tensor: out, record, part: sent.part, ...(cut ? { cut } : {}) };
      const records = [...request.records, record];
      if (next) {
        const stream = await peers.to(next, STAGE_PROTOCOL);
        const rest = (keyMask ? [positions, keyMask] : [positions]).map((t) => toWire(t, id));
        const frames = [{ requestId: id, ...sent.part }, ...rest].map((w) => encodeTensor(w));
        // the body goes on as it came (its codec too): only the route shortens and the records grow
        const header = encodeControl({ ...body, route: request.route.slice(1), records, tensors: frames.length });
        countSent(job, 'activations', [header, ...frames.map((f) => f[0])], frames.map((f) => f[1]));
        await sendMessage(stream, [header, ...frames.flat()], { stallMs });
      } else {
        const owner = await peers.to({ peerId: job.owner, addrs: [] }, RESULT_PROTOCOL);
        const requestId = request.replyTo.requestId;
        const header = encodeControl({ type: 'records', id: requestId, records });
        const [head, payload] = encodeTensor({ requestId, ...sent.part });
        countSent(job, 'activations', [header, head], [payload]);
        await sendMessage(owner, [header, head, payload], { stallMs });
      }
      return NONE;
    },
  },
  // how far a session has come: a user whose chained step is late asks each stage, and the first one behind is the one holding it up
  'session-status': {
    run: ({ body, job }) => {
      const session = sectionOf(job).sessions.get(parseSessionId(body.sessionId));
      // a session on a device holds its cache in its runner
      return control('session-status', { position: session?.device?.cached ?? session?.cache.length ?? 0, busy: session?.busy === true });
    },
  },
  // a speculative pass cut to its accepted positions: the cache and what the session keeps drop the rest, and the
  // step's record is signed again for the positions kept (what the pass computed for them is what a step of them alone
  // computes: attention is causal)
  'truncate': {
    run: ({ body, job }, { memory, signer }) => {
      const section = sectionOf(job);
      return control('truncated', { record: cutSession(section, job.jobId, parseSessionId(body.sessionId), body.length, memory, signer) });
    },
  },
  'close': {
    run: ({ body, job }, { jobs, memory }) => {
      sectionOf(job);
      jobs.dropSession(job, parseSessionId(body.sessionId), memory);
      return control('closed');
    },
  },
};

/**
 * Cuts a session's last step (a speculative pass) to its first `length` positions: the cache and what the session keeps
 * drop the rest, and the step's record is signed again for the positions kept (what the pass computed for them is what a
 * step of them alone computes: attention is causal). The new record, or the step's own when it is kept whole.
 */
function cutSession(
  section: Section, jobId: string, sessionId: string, length: unknown, memory: MemoryBudget, signer: RecordSigner,
): WorkRecord {
  const session = section.sessions.get(sessionId);
  if (!session) throw new InvalidMessageError(`session ${sessionId} is not open`);
  const last = session.history.at(-1);
  if (!last || !session.lastOutput) throw new InvalidMessageError(`session ${sessionId} has no step to cut (a step of more than ${COMMIT_CHUNK} positions is none)`);
  if (session.device) throw new InvalidArgumentError('a session on a device cannot drop positions yet (speculative decoding runs on CPU workers)');
  if (session.busy) throw new InvalidMessageError(`session ${sessionId} is computing a step: a cut comes after it`);
  if (last.record.cut !== undefined) throw new InvalidMessageError(`session ${sessionId}: its last step was cut already (a step is cut once)`);
  if (last.record.sent !== undefined) throw new InvalidArgumentError('a session whose hidden states travel compressed cannot drop positions');
  const from = last.record.step;
  const steps = last.input.shape[1] ?? 1;
  if (typeof length !== 'number' || !Number.isInteger(length) || length <= from || length > from + steps) {
    throw new InvalidMessageError(`session ${sessionId}: its last step holds positions ${from}–${from + steps - 1}, it cannot keep ${String(length)}`);
  }
  if (length === from + steps) return last.record;
  const keep = length - from;
  const { input, positions, keyMask, output: out } = cutStep({ ...last, output: session.lastOutput }, keep, ['input', 'output']);
  session.cache.truncate(length);
  const commits = truncateCommits(session, from, keep);
  // the record names the pass's record it replaces: an audit of that one is answered by this one
  const extra = { cut: recordId(last.record), ...(commits ? { commits } : {}) };
  const record = decodeRecord(section, jobId, sessionId, from, { input, positions, keyMask, out }, signer, extra);
  const bytes = (h: { input: Tensor; positions: Tensor; keyMask: Tensor | null; output?: Tensor }) =>
    [h.input, h.positions, h.keyMask, h.output].reduce((sum, t) => sum + (t ? 4 * t.size : 0), 0);
  const kept = { input, positions, keyMask, record, ...(last.output ? { output: out } : {}) };
  // a paged cache's pages are charged as its pool holds them
  const pages = session.cache.pool ? sectionPages(section) : undefined;
  const dropped = pages ? 0 : (input.shape[0] ?? 1) * (steps - keep) * kvBytesPerToken(section.model.layers);
  const freed = dropped + bytes(last) - bytes(kept);
  session.history[session.history.length - 1] = kept;
  session.lastOutput = out;
  session.kvBytes -= freed;
  memory.add(jobId, 'kv-cache', -freed, `positions ${length}–${from + steps - 1} of session ${sessionId} dropped`);
  if (pages) syncPages(pages, memory, jobId);
  return record;
}

/** The signed record of a session's step of `step.input` at `position`, with what else the record names. */
function decodeRecord(
  section: Section, jobId: string, sessionId: string, position: number,
  step: { input: Tensor; positions: Tensor; keyMask: Tensor | null; out: Tensor }, signer: RecordSigner,
  extra: { sent?: string; commits?: string; cut?: string },
): WorkRecord {
  const { input, positions, keyMask, out } = step;
  // the weights it holds, hashed in checkpoint-name order
  const weights = (section.weightsHash ??= checkpointHash(section.model));
  const cost = (section.cost ??= sectionCost(section.model.config, section.range));
  return signRecord({
    job: jobId, step: position, micro: 0, stage: section.range, kind: 'decode', session: sessionId, input: hashTensors([input]),
    aux: auxHash(positions, keyMask), config: section.configHash, flops: Math.round(recordFlops('decode', cost, input.shape[0] * (input.shape[1] ?? 1))),
    output: hashTensors([out]), ...extra, weights, backend: computeName(), seq: (section.seq = (section.seq ?? 0) + 1),
  }, signer);
}

const batchers = new WeakMap<Section, DecodeBatcher>();

/** The section's batcher of decoding steps (decode-batcher.ts). */
function batcherOf(section: Section, work: WorkCounters): DecodeBatcher {
  let b = batchers.get(section);
  if (!b) batchers.set(section, (b = new DecodeBatcher(section.model, work)));
  return b;
}

/** Positions [1, T] that are 0, 1, …, T − 1 (a sequence's first step). */
function fromZero(positions: Tensor): boolean {
  return positions.shape[0] === 1 && positions.dtype === 'int32' && positions.data.every((p, i) => p === i);
}

/** Bytes of KV cache one token of a session takes in these layers. */
function kvBytesPerToken(layers: readonly ModelLayer[]): number {
  return layers.reduce((sum, l) => sum + l.profile().kvBytesPerToken, 0);
}
