import { InvalidMessageError } from '../../../errors.ts';
import type { WireTensor } from '../../frames.ts';
import { fail, finite, int, list, obj, peerIdText, str, strings } from '../../schema.ts';
import { parseAssignment, parseJobId, type StageAssignment } from '../../vocabulary.ts';
import { HEX64, sha256, type WeightEntry } from './chunks.ts';
import { MAX_CHUNKS_PER_WEIGHT, MAX_KEY_LENGTH, MAX_NAME_LENGTH, MAX_NAMES, MAX_ROUTE, MAX_TENSORS_PER_REQUEST } from './constants.ts';

/**
 * Messages of the stage protocol. A request is a control frame {id, type, jobId, tensors: n}
 * followed by the n tensor frames it announces (their requestId = id); answers carry the id.
 *
 * Loading (owner only):
 *   load       {config, section: [start, end], upstream?, assignment?, format?, adapter?} → loading {weights}:
 *              the worker has reserved the section's memory and built it empty. `assignment` lists the
 *              job's sections (peer ids and addresses): the only peers this worker will dial for the job.
 *              `adapter` {r, alpha, targets, rslora}: LoRA factors on the section (they arrive with its
 *              weights, as `<module>.lora_A.weight`, float32); the base is frozen and only they train.
 *              `base` (a hosted model's hash, with `adapter`): the section shares the blocks the worker
 *              hosts (one copy for every job) and only the factors arrive.
 *   manifest   {weights: [{name, shape, chunks}]}  → need {chunks}: some of the section's weights,
 *              each as the sha256 of its float32 chunks; the worker fills what it holds (its chunk
 *              store, the checkpoints of its --models) and names the chunks it lacks.
 *   chunk      {sha} + its bytes                → nothing (hash-checked, listed by a manifest,
 *              written into the section as it arrives)
 *   assemble   {}                               → loaded {params, received, reused}: bytes sent
 *              to it and bytes it had
 *   assign     {assignment, upstream?}          → assigned: the job's sections moved (a stage was replaced)
 * Inference:
 *   forward    {sessionId} + input, positions[, key mask] → the output; with `replyTo: {requestId}`
 *              and `route: [peer ids]` it travels on worker to worker (owner, or the upstream stage)
 *              and the last stage sends it to the job's owner on the result protocol. With `keep: length`
 *              (answered directly only) the session's last step, a speculative pass, is cut to `length`
 *              positions first, as `truncate` does: its re-signed record comes beside the step's (`cut`).
 *   truncate   {sessionId, length}              → truncated {record}: the last step cut, re-signed
 *   session-status {sessionId}                  → {position, busy}: how far a session has come (a user
 *              whose chained step is late finds the stage holding it up)
 *   close      {sessionId}                      → closed
 * Training (owner; `grads` also from the job's other holders):
 *   train-setup {lr, weightDecay?, recompute?, peers, keepMicros?} → train-ready {names}
 *   train-forward {micro} + input → output      train-backward {micro} + gradient → input gradient | no-input-gradient
 *              Either may take `from: {peer, key}` instead of the tensor (that neighbour passed it here
 *              under key) and `to: {peer, key}`: the result goes to that worker of the job as a train-pass
 *              and the answer is `passed {record, shape}`. `codec: 'fp16' | 'int8'` says how the
 *              result travels (fp16: a float16 tensor; int8: an int8 tensor [..., 4 + cols], each row
 *              its float32 scale's 4 bytes and its values); a hop's tensor says by its dtype how it
 *              was encoded (token ids are never encoded).
 *   train-pass {key} + tensor → nothing  (from the job's other workers: a tensor ahead of its request)
 *   grad-squares {names} → {values}             reduce {key, names, peers, index, micros?} → reduced
 *              (with `micros`, each holder's micro-batches: every micro-batch's gradients are exchanged
 *              and added in the batch's order, as one process accumulates them)
 *   grads {key, index} + gradients → nothing    step {scale, lr} → stepped
 *   weight {name} → tensor                      moment-steps {names} → {steps}
 *   moments {name} → [2, ...shape]              set-moments {name, step} + moments → moments-set
 *   train-reset {} → reset
 * Records: every train-forward, train-backward and forward answer is preceded by a control
 *   frame {type: 'record', id, record} (its signed record, same id); step answers carry theirs.
 * Audits (owner, or a peer it named in train-setup: a validator):
 *   audit-index {kind, step, micro, session?}  → audit {record, parts: [{part, name?, shape, step?}]}
 *   audit-part {kind, step, micro, part, name?} → tensor: what re-running the record needs
 */

export const LOAD_REQUESTS = ['load', 'manifest', 'chunk', 'assemble', 'assign'] as const;
export const INFERENCE_REQUESTS = ['forward', 'truncate', 'session-status', 'close'] as const;
export const TRAINING_REQUESTS = [
  'train-setup', 'train-forward', 'train-backward', 'train-pass', 'grad-squares', 'reduce', 'grads', 'step', 'weight', 'moment-steps', 'moments', 'set-moments', 'train-reset',
] as const;
export const AUDIT_REQUESTS = ['audit-index', 'audit-part'] as const;
export const AUDIT_PARTS = ['weight', 'input', 'grad', 'output', 'grads', 'moments', 'positions', 'mask', 'contribution'] as const;
export type AuditPart = (typeof AUDIT_PARTS)[number];
export type StageRequestType
  = | (typeof LOAD_REQUESTS)[number]
    | (typeof INFERENCE_REQUESTS)[number]
    | (typeof TRAINING_REQUESTS)[number]
    | (typeof AUDIT_REQUESTS)[number];

/** The envelope of every request: what it is, for which job, how many tensors follow. */
export interface StageEnvelope {
  id: number;
  type: string;
  jobId: unknown;
  tensors: number;
  body: Record<string, unknown>;
}

export function parseStageEnvelope(message: unknown): StageEnvelope {
  const body = obj(message, 'request');
  return {
    id: int(body.id, 'request.id'),
    type: str(body.type, 'request.type', 64),
    jobId: body.jobId,
    tensors: int(body.tensors ?? 0, 'request.tensors', 0, MAX_TENSORS_PER_REQUEST),
    body,
  };
}

export { parseJobId };

/** The tensors a request announced: exactly `n` of them. */
export function expectTensors(type: string, tensors: WireTensor[], n: number | readonly number[]): WireTensor[] {
  const allowed = typeof n === 'number' ? [n] : n;
  if (!allowed.includes(tensors.length)) throw new InvalidMessageError(`${type} takes ${allowed.join(' or ')} tensor(s), got ${tensors.length}`);
  return tensors;
}

export function parseWeightEntry(v: unknown, what = 'weight'): WeightEntry {
  const e = obj(v, what);
  const name = str(e.name, `${what}.name`, MAX_NAME_LENGTH);
  if (!Array.isArray(e.shape) || e.shape.length > 8 || !e.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) fail(`'${name}' needs a shape`);
  if (!Array.isArray(e.chunks) || e.chunks.length > MAX_CHUNKS_PER_WEIGHT || !e.chunks.every((c) => typeof c === 'string' && HEX64.test(c))) {
    fail(`'${name}' needs the sha256 of each chunk`);
  }
  const format = e.format === undefined ? {} : { format: sectionFormat(e.format) };
  return { name, shape: e.shape as number[], chunks: e.chunks as string[], ...format };
}

export interface LoadRequest {
  config: Record<string, unknown>;
  section: [number, number];
  /** The previous stage of a chain: it may pass activations on for this job. */
  upstream: string | undefined;
  /** Every section of the job; empty when the owner drives this section alone. */
  assignment: StageAssignment[];
  /** Peers (validators) the owner lets fetch what re-running this section's records needs. */
  verifiers: string[];
  /** The compact format the section's matrices are held in once loaded (absent: float32). */
  format?: SectionFormat;
  /** A LoRA adapter on the section: the base frozen, the factors (sent with the base's weights) the only trained weights. */
  adapter?: WireAdapter;
  /**
   * The section's base is a model this worker hosts (its manifest hash): the section shares the hosted weights (one
   * copy for every job over them) and only the adapter's factors are sent.
   */
  base?: string;
}

/**
 * A LoRA adapter as a load names it: rank, alpha, rsLoRA's scale, and the module names it adapts (names only: a
 * peer's regular expression is not compiled).
 */
export interface WireAdapter {
  r: number;
  alpha: number;
  targets: string[];
  rslora: boolean;
}

/**
 * The sha256 a job's records name for its config (the config as JSON; with its adapter, when it has one, so that an
 * audit re-runs what the worker was given; and with the hosted model its base is, for a job over one, so that an
 * audit checks the base the worker was told to compute with).
 */
export function jobConfigHash(config: Record<string, unknown>, adapter?: WireAdapter, base?: { hash: string; format: string }): string {
  const named = { ...config, ...(adapter ? { lora_adapter: adapter } : {}), ...(base ? { hosted_base: `${base.hash}:${base.format}` } : {}) };
  return sha256(new TextEncoder().encode(JSON.stringify(named)));
}

export function parseAdapter(v: unknown): WireAdapter {
  const m = obj(v, 'adapter');
  const targets = strings(m.targets, 'adapter.targets', 64, MAX_NAME_LENGTH);
  if (targets.length === 0 || !targets.every((t) => /^[\w.]+$/.test(t))) fail('adapter.targets must be module names (letters, digits, _ and .)');
  return {
    r: int(m.r, 'adapter.r', 1, 4096),
    alpha: finite(m.alpha, 'adapter.alpha', Number.MIN_VALUE, 1e6),
    targets,
    rslora: m.rslora === true,
  };
}

/** The compact formats a section may be held in (the tensor layer's WeightFormat, named here for the wire). */
export const SECTION_FORMATS = ['bf16', 'int8', 'int4'] as const;
export type SectionFormat = (typeof SECTION_FORMATS)[number];

export function parseLoad(m: Record<string, unknown>): LoadRequest {
  const range = m.section;
  if (!Array.isArray(range) || range.length !== 2 || !range.every((x) => Number.isSafeInteger(x) && x >= 0) || range[0] >= range[1]) {
    fail('section must be [start, end] with 0 ≤ start < end');
  }
  return {
    config: obj(m.config, 'config'),
    section: [range[0], range[1]],
    upstream: m.upstream === undefined ? undefined : peerIdText(m.upstream, 'upstream'),
    assignment: m.assignment === undefined ? [] : parseAssignment(m.assignment),
    verifiers: m.verifiers === undefined ? [] : list(m.verifiers, 'verifiers', 16, peerIdText),
    ...(m.format === undefined ? {} : { format: sectionFormat(m.format) }),
    ...(m.adapter === undefined ? {} : { adapter: parseAdapter(m.adapter) }),
    ...(m.base === undefined ? {} : { base: hex64(m.base, 'base') }),
  };
}

function hex64(v: unknown, what: string): string {
  if (typeof v !== 'string' || !HEX64.test(v)) fail(`${what} must be a sha256 (64 hex digits)`);
  return v;
}

function sectionFormat(v: unknown): SectionFormat {
  if (typeof v !== 'string' || !(SECTION_FORMATS as readonly string[]).includes(v)) fail(`format must be one of ${SECTION_FORMATS.join(', ')}`);
  return v as SectionFormat;
}

export function parseManifest(m: Record<string, unknown>): WeightEntry[] {
  return list(m.weights, 'weights', MAX_NAMES, parseWeightEntry);
}

export function parseAssign(m: Record<string, unknown>): { assignment: StageAssignment[]; upstream: string | undefined } {
  return { assignment: parseAssignment(m.assignment), upstream: m.upstream === undefined ? undefined : peerIdText(m.upstream, 'upstream') };
}

export function parseChunk(m: Record<string, unknown>): { sha: string } {
  if (typeof m.sha !== 'string' || !HEX64.test(m.sha)) fail('a chunk is {sha} and its bytes');
  return { sha: m.sha };
}

export function parseSessionId(v: unknown): string {
  if (typeof v !== 'string' || v.length === 0 || v.length > MAX_KEY_LENGTH) fail('sessionId must be a short string');
  return v;
}

export interface ForwardRequest {
  sessionId: string;
  /** Where the output goes on: the peer ids of the later stages (each must be in the job's assignment). */
  route: string[];
  /** Set when the output goes to the job's owner on the result protocol, under this request id. */
  replyTo: { requestId: number } | null;
  /** The signed records of the chain's earlier stages (opaque here: the owner checks them). */
  records: unknown[];
  /** How the hidden states travel to and from this stage, and on along the route (null: float32). */
  codec: WireActivationCodec | null;
  /** Positions of the session to keep before the step (its last step, a speculative pass, cut to them). */
  keep?: number;
}

function parseReplyTo(v: unknown): { requestId: number } | null {
  return v === undefined ? null : { requestId: int(obj(v, 'replyTo').requestId, 'replyTo.requestId') };
}

export function parseForward(m: Record<string, unknown>): ForwardRequest {
  const replyTo = parseReplyTo(m.replyTo);
  const route = m.route === undefined ? [] : list(m.route, 'route', MAX_ROUTE, peerIdText);
  if (route.length > 0 && !replyTo) fail('a routed forward needs replyTo');
  const records = m.records === undefined ? [] : m.records;
  if (!Array.isArray(records) || records.length > MAX_ROUTE) fail(`records must be a list of at most ${MAX_ROUTE}`);
  const keep = m.keep === undefined ? undefined : int(m.keep, 'keep', 1);
  if (keep !== undefined && replyTo) fail('a cut (keep) rides only on a forward answered directly');
  const request = { sessionId: parseSessionId(m.sessionId), route, replyTo, records, codec: parseCodec(m.codec) };
  return keep === undefined ? request : { ...request, keep };
}

/** The replyTo of a request alone, if it has a well-formed one: errors of chained forwards go there, whatever else is wrong. */
export function replyToOf(m: Record<string, unknown>): { requestId: number } | null {
  try {
    return parseReplyTo(m.replyTo);
  } catch {
    return null;
  }
}

export function parseNames(v: unknown): string[] {
  return strings(v, 'names', MAX_NAMES, MAX_NAME_LENGTH);
}

export function parseName(v: unknown): string {
  return str(v, 'name', MAX_NAME_LENGTH);
}

export function parseMicro(m: Record<string, unknown>): number {
  return int(m.micro, 'micro', 0, 1_000_000);
}

/** How activations (and their gradients) may travel on a hop, in training or a session: float16, or int8 with a float32 scale per row. */
export const WIRE_ACTIVATION_CODECS = ['fp16', 'int8'] as const;
export type WireActivationCodec = (typeof WIRE_ACTIVATION_CODECS)[number];

function parseCodec(v: unknown): WireActivationCodec | null {
  if (v === undefined) return null;
  if (!WIRE_ACTIVATION_CODECS.includes(v as WireActivationCodec)) fail(`codec must be one of ${WIRE_ACTIVATION_CODECS.join(', ')}`);
  return v as WireActivationCodec;
}

/** A training forward's or backward's routing: its tensor from a neighbour, its result to one, and how tensors travel. */
export interface TrainCompute {
  micro: number;
  /** The neighbour that passed the input (or gradient) and the key it used; null when it comes with the request. */
  from: { peer: string; key: string } | null;
  /** Where the result goes instead of back: a worker of the job's assignment, and the key to pass it under. */
  to: { peer: string; key: string } | null;
  codec: WireActivationCodec | null;
}

export function parseTrainCompute(m: Record<string, unknown>): TrainCompute {
  const to = m.to === undefined ? null : obj(m.to, 'to');
  const from = m.from === undefined ? null : obj(m.from, 'from');
  return {
    micro: parseMicro(m),
    from: from ? { peer: peerIdText(from.peer, 'from.peer'), key: str(from.key, 'from.key', MAX_KEY_LENGTH) } : null,
    to: to ? { peer: peerIdText(to.peer, 'to.peer'), key: str(to.key, 'to.key', MAX_KEY_LENGTH) } : null,
    codec: parseCodec(m.codec),
  };
}

export function parsePass(m: Record<string, unknown>): { key: string } {
  return { key: str(m.key, 'key', MAX_KEY_LENGTH) };
}

/** A `passed` answer: the result went on to another worker; its shape comes back with the record. */
export function parsePassedAnswer(m: Record<string, unknown>): { shape: number[] } {
  if (m.type !== 'passed') fail(`expected a passed answer, got ${String(m.type)}`);
  const shape = list(m.shape, 'shape', 8, (d, what) => int(d, what, 0, 2 ** 31));
  return { shape };
}

export interface TrainSetupRequest {
  /** Steps keep the state they started from, for re-running step records (verification on). */
  keepState: boolean;
  lr: number;
  weightDecay: number | undefined;
  recompute: boolean;
  /** Peer ids that may send this job's gradients here (replicas, the other holder of a tied head). */
  peers: string[];
  /** Gradients among holders travel DCT top-k compressed with these settings (the worker checks their ranges). */
  compressGrads: { k: number; chunk: number; bits: number } | null;
  /**
   * Replicas take local steps and average their weights' changes every this many steps
   * (`sync`); the worker keeps the weights they start from. 1: gradients reduce every step.
   */
  syncEvery: number;
  /** Each micro-batch's contribution to the gradients is kept until the step: an ordered reduction (`micros`) adds them in order. */
  keepMicros: boolean;
}

/** The most local steps between averages a job may ask for. */
export const MAX_SYNC_EVERY = 10_000;

export function parseTrainSetup(m: Record<string, unknown>): TrainSetupRequest {
  return {
    lr: finite(m.lr, 'lr'),
    weightDecay: m.weightDecay === undefined ? undefined : finite(m.weightDecay, 'weightDecay'),
    recompute: m.recompute === true,
    keepState: m.keepState === true,
    peers: m.peers === undefined ? [] : list(m.peers, 'peers', 256, peerIdText),
    compressGrads: m.compressGrads === undefined ? null : parseCompressGrads(obj(m.compressGrads, 'compressGrads')),
    syncEvery: m.syncEvery === undefined ? 1 : int(m.syncEvery, 'syncEvery', 1, MAX_SYNC_EVERY),
    keepMicros: m.keepMicros === true,
  };
}

function parseCompressGrads(c: Record<string, unknown>): { k: number; chunk: number; bits: number } {
  return { k: int(c.k, 'compressGrads.k', 1, 65_536), chunk: int(c.chunk, 'compressGrads.chunk', 1, 256), bits: int(c.bits, 'compressGrads.bits', 8, 32) };
}

export interface ReduceRequest {
  key: string;
  names: string[];
  /** The holders' peer ids, in the order their gradients are added. */
  peers: string[];
  index: number;
  /**
   * The micro-batches each holder ran (replicas): every holder sends each micro-batch's contribution and adds them
   * all in the batch's order, as one process accumulates them (bit for bit). Absent: each holder's sum, added in
   * the order of `peers`.
   */
  micros?: number[][];
}

export function parseReduce(m: Record<string, unknown>): ReduceRequest {
  const peers = list(m.peers, 'peers', 256, peerIdText);
  const out: ReduceRequest = { key: str(m.key, 'key', MAX_KEY_LENGTH), names: parseNames(m.names), peers, index: int(m.index, 'index', 0, peers.length - 1) };
  if (m.micros !== undefined) {
    const micros = list(m.micros, 'micros', 256, (v, what) => list(v, what, 4096, (k, w) => int(k, w, 0, 1_000_000)));
    const all = micros.flat();
    if (micros.length !== peers.length || new Set(all).size !== all.length) fail('micros: one list of distinct micro-batches per holder');
    out.micros = micros;
  }
  return out;
}

export function parseGrads(m: Record<string, unknown>): { key: string; index: number } {
  return { key: str(m.key, 'key', MAX_KEY_LENGTH), index: int(m.index, 'index', 0, 255) };
}

/** A holder's answer to `sync`: the hash of its weights after the average (every holder of the group must name the same). */
export function parseSyncedAnswer(m: Record<string, unknown>): { weights: string } {
  const weights = str(m.weights, 'weights', 64);
  if (!/^[0-9a-f]{64}$/.test(weights)) fail('synced: weights must be a sha256 in hex');
  return { weights };
}

export function parseStep(m: Record<string, unknown>): { scale: number; lr: number } {
  return { scale: finite(m.scale, 'scale', 0, 1), lr: finite(m.lr, 'lr') };
}

export function parseSetMoments(m: Record<string, unknown>): { name: string; step: number } {
  return { name: parseName(m.name), step: int(m.step, 'step', 0) };
}

/* Answers, parsed by the user's side. */

export function parseNeedAnswer(m: Record<string, unknown>, known: ReadonlySet<string>): string[] {
  const need = m.chunks;
  if (!Array.isArray(need) || !need.every((c) => typeof c === 'string' && known.has(c))) fail('load: the worker asked for chunks the manifest does not list');
  return need as string[];
}

export function parseLoadedAnswer(m: Record<string, unknown>): { params: number; received: number; reused: number } {
  return { params: int(m.params, 'params', 0), received: int(m.received, 'received', 0), reused: int(m.reused, 'reused', 0) };
}

export function parseTrainReady(m: Record<string, unknown>): string[] {
  return parseNames(m.names);
}

export function parseGradSquares(m: Record<string, unknown>, count: number): number[] {
  const values = m.values;
  if (!Array.isArray(values) || values.length !== count || !values.every((v) => typeof v === 'number' && Number.isFinite(v) && v >= 0)) {
    fail('grad-squares: expected one finite number per name');
  }
  return values as number[];
}

export function parseMomentSteps(m: Record<string, unknown>, count: number): (number | null)[] {
  const steps = m.steps;
  if (!Array.isArray(steps) || steps.length !== count || !steps.every((s) => s === null || (Number.isSafeInteger(s) && s >= 0))) {
    fail('moment-steps: expected one step count (or null) per name');
  }
  return steps as (number | null)[];
}

export interface AuditRequest {
  kind: 'forward' | 'backward' | 'step' | 'decode';
  step: number;
  micro: number;
  /** A decoding step's session. */
  session?: string;
  part?: AuditPart;
  name?: string;
  /** A decoding step's bundle without the section's weights (a validator that holds them already: `weights: false`). */
  weights?: boolean;
  /** A decoding step's bundle from this step of its session on (a validator that prefilled the steps before). */
  from?: number;
}

/** Which kept computation an audit asks about (and, for audit-part, which piece of it). */
export function parseAudit(m: Record<string, unknown>, withPart: boolean): AuditRequest {
  const kind = str(m.kind, 'kind', 16);
  if (kind !== 'forward' && kind !== 'backward' && kind !== 'step' && kind !== 'decode') fail(`kind must be forward, backward, step or decode, got '${kind}'`);
  const out: AuditRequest = { kind, step: int(m.step, 'step', 0), micro: parseMicro(m) };
  if (kind === 'decode') out.session = parseSessionId(m.session);
  if (m.weights === false) out.weights = false;
  if (m.from !== undefined) out.from = int(m.from, 'from', 0, 1_000_000);
  if (withPart) {
    const part = str(m.part, 'part', 16) as AuditPart;
    if (!AUDIT_PARTS.includes(part)) fail(`part must be one of ${AUDIT_PARTS.join(', ')}`);
    out.part = part;
    if (m.name !== undefined) out.name = parseName(m.name);
  }
  return out;
}
