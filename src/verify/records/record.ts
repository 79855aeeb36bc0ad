import { createHash } from 'node:crypto';
import { InvalidMessageError, VerificationError } from '../../errors.ts';
import { COMMIT_BYTES } from './commit.ts';
import { signEd25519, verifyEd25519 } from './ed25519.ts';

/** What a worker computed: one micro-batch's forward or backward at one step, an optimizer step, a decoding step. */
export const RECORD_KINDS = ['forward', 'backward', 'step', 'decode'] as const;
export type RecordKind = (typeof RECORD_KINDS)[number];

/**
 * A worker's signed statement of one computation. Hashes are sha256 (hex) of tensors
 * (`hashTensors`) or of a section's named state:
 * - forward/decode: `input` the activations (or ids) it was given, `output` what it returned
 *   (a decoding step names its `session`; its `step` is the session's position);
 * - backward: `input` the gradient of its output, `output` the gradient of its input ('' for
 *   token ids), `grads` this micro-batch's contribution to its parameters' gradients;
 * - step: `input` the gradients it stepped with, `state`/`after` AdamW's state before and
 *   after, `output` the weights after, with the `scale` and `lr` it was told;
 * - every kind: `weights` the section's weights it computed with (before a step).
 * Records chain: a stage's input hash is its predecessor's output hash, and a step's forward
 * records name the weights the previous step record produced.
 */
export interface WorkFields {
  job: string;
  step: number;
  micro: number;
  /** The section's global layer range [start, end). */
  stage: [number, number];
  kind: RecordKind;
  /** A decoding step's session (its `step` is the session's position). */
  session?: string;
  input: string;
  output: string;
  /**
   * A training forward or backward whose result travelled compressed (fp16, int8): the hash of
   * the result as its receiver decodes it. The receiver's record names this as its input, while
   * `output` stays the exact result a re-run reproduces.
   */
  sent?: string;
  weights: string;
  grads?: string;
  state?: string;
  after?: string;
  scale?: number;
  lr?: number;
  /** A step's weight decay (absent: AdamW's default), so that re-running it uses the worker's optimizer. */
  weightDecay?: number;
  /** A backward: the hash of the forward input it differentiated (the forward record's `input`). */
  from?: string;
  /** A decoding step: the hash of its positions (and key mask). */
  aux?: string;
  /** The sha256 of the model config the worker was given (as JSON): re-execution uses the same. */
  config?: string;
  /** FLOPs of the computation (`recordFlops`): what the ledger pays for; a re-execution checks it. */
  flops?: number;
  /** The backend that computed it: 'js' results are compared bit for bit, 'ort' within ORT_TOLERANCE. */
  backend: string;
  /** The worker's peer id; its Ed25519 key signs the record. */
  peer: string;
  /** The worker's count of records for this job: a replayed record repeats a number. */
  seq: number;
  /**
   * A forward or decoding step that closed chunks of COMMIT_CHUNK positions: their activation commitments (commit.ts),
   * base64, COMMIT_BYTES() each, chunk by chunk and within a chunk row by row (see `closedChunks`).
   */
  commits?: string;
  /**
   * A decoding step re-signed for its first positions (a speculative pass cut to its accepted ones): the id
   * (recordId) of the pass's record it replaces. A step is cut at most once.
   */
  cut?: string;
}

export interface WorkRecord extends WorkFields {
  /** Ed25519 signature (base64) over `recordBytes`. */
  sig: string;
}

/** The order fields are signed in: the record's canonical form does not depend on how an object was built. */
const FIELDS: readonly (keyof WorkFields)[] = [
  'job', 'step', 'micro', 'stage', 'kind', 'session', 'input', 'output', 'weights', 'grads', 'state', 'after', 'scale', 'lr', 'weightDecay',
  'from', 'aux', 'config', 'flops', 'backend', 'peer', 'seq', 'sent', 'commits', 'cut',
];

/** The most commitments one record may carry (a prefill of 4,096 positions of 32 rows, or any shape under it). */
export const MAX_RECORD_COMMITS = 4096;
const COMMITS = /^[A-Za-z0-9+/]*={0,2}$/;

function commits(v: unknown): string | undefined {
  if (v === undefined) return undefined;
  const bytes = COMMIT_BYTES();
  if (typeof v !== 'string' || v.length > Math.ceil((MAX_RECORD_COMMITS * bytes) / 3) * 4 || !COMMITS.test(v) || (v.length * 3) / 4 < bytes) {
    throw new InvalidMessageError(`record.commits must be base64 of 1 to ${MAX_RECORD_COMMITS} commitments`);
  }
  return v;
}

/**
 * The bytes a record's signature covers: its fields in a fixed order, as JSON.
 * @example
 * recordBytes(a).toString() === recordBytes({ ...a }).toString() // true: the order of an object's keys does not count
 */
export function recordBytes(r: WorkFields): Uint8Array {
  const entries = FIELDS.filter((k) => r[k] !== undefined).map((k) => [k, r[k]]);
  return new TextEncoder().encode(JSON.stringify(entries));
}

/**
 * A record's content address: the sha256 of its signed bytes and signature.
 * @example
 * ledger.has(recordId(record)) // a record is found in blocks and proofs by its id (64 hex digits)
 */
export function recordId(r: WorkRecord): string {
  return createHash('sha256').update(recordBytes(r)).update(r.sig).digest('hex');
}

/** Who signs: a peer id and the 32-byte seed of its Ed25519 key (libp2p's identity key). */
export interface RecordSigner {
  peer: string;
  seed: Uint8Array;
}

/**
 * An Ed25519 signature (base64) of `bytes` with the signer's key: records, and the ledger's block headers.
 * @example
 * const sig = signBytes(headerBytes, { peer: node.peerId.toString(), seed })
 */
export function signBytes(bytes: Uint8Array, signer: RecordSigner): string {
  return signEd25519(bytes, signer.seed);
}

/**
 * Whether `sig` (base64) signs `bytes` under the raw 32-byte Ed25519 `publicKey`.
 * @example
 * bytesSignatureValid(headerBytes, sig, publicKeyOf(peer)) // false for a forged, altered or malformed signature
 */
export function bytesSignatureValid(bytes: Uint8Array, sig: string, publicKey: Uint8Array): boolean {
  return verifyEd25519(bytes, sig, publicKey);
}

/**
 * A worker's record of one computation, signed with its key (`peer` is the signer's).
 * @example
 * const record = signRecord({ job, step, micro, stage: [0, 2], kind: 'forward', input, output, weights, backend: 'js', seq }, signer)
 */
export function signRecord(fields: Omit<WorkFields, 'peer'>, signer: RecordSigner): WorkRecord {
  const r: WorkFields = { ...fields, peer: signer.peer };
  return { ...r, sig: signBytes(recordBytes(r), signer) };
}

/**
 * Whether the record's signature is its peer's: `publicKey` is the raw 32-byte Ed25519 key of `record.peer`.
 * @example
 * signatureValid({ ...record, output: other }, publicKey) // false: a changed field breaks the signature
 */
export function signatureValid(record: WorkRecord, publicKey: Uint8Array): boolean {
  return bytesSignatureValid(recordBytes(record), record.sig, publicKey);
}

const HASH = /^[0-9a-f]{64}$/;
const MAX_TEXT = 200;

function text(v: unknown, what: string, pattern?: RegExp): string {
  if (typeof v !== 'string' || v.length > MAX_TEXT || (pattern && !pattern.test(v))) throw new InvalidMessageError(`record.${what} is not a valid value`);
  return v;
}

function count(v: unknown, what: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) throw new InvalidMessageError(`record.${what} must be a non-negative integer`);
  return v;
}

function num(v: unknown, what: string): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new InvalidMessageError(`record.${what} must be a finite number`);
  return v;
}

function hash(v: unknown, what: string, optional: boolean): string | undefined {
  if (v === undefined && optional) return undefined;
  return text(v, what, HASH);
}

/**
 * Parses a record from a peer (untrusted): every field typed and bounded, or a typed error.
 * @example
 * const record = parseRecord(JSON.parse(text)) // InvalidMessageError naming the field that is wrong
 */
export function parseRecord(v: unknown): WorkRecord {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new InvalidMessageError('a record must be an object');
  const m = v as Record<string, unknown>;
  const kind = text(m.kind, 'kind') as RecordKind;
  if (!RECORD_KINDS.includes(kind)) throw new InvalidMessageError(`record.kind '${kind}' is not one of ${RECORD_KINDS.join(', ')}`);
  const stage = m.stage;
  if (!Array.isArray(stage) || stage.length !== 2) throw new InvalidMessageError('record.stage must be [start, end]');
  const output = m.output === '' && kind === 'backward' ? '' : text(m.output, 'output', HASH);
  const r: WorkRecord = {
    job: text(m.job, 'job'),
    step: count(m.step, 'step'),
    micro: count(m.micro, 'micro'),
    stage: [count(stage[0], 'stage'), count(stage[1], 'stage')],
    kind,
    session: m.session === undefined ? undefined : text(m.session, 'session'),
    input: text(m.input, 'input', HASH),
    output,
    sent: hash(m.sent, 'sent', true),
    weights: text(m.weights, 'weights', HASH),
    grads: hash(m.grads, 'grads', true),
    state: hash(m.state, 'state', true),
    after: hash(m.after, 'after', true),
    scale: num(m.scale, 'scale'),
    lr: num(m.lr, 'lr'),
    weightDecay: num(m.weightDecay, 'weightDecay'),
    from: hash(m.from, 'from', true),
    aux: hash(m.aux, 'aux', true),
    config: hash(m.config, 'config', true),
    flops: m.flops === undefined ? undefined : count(m.flops, 'flops'),
    backend: text(m.backend, 'backend'),
    peer: text(m.peer, 'peer'),
    seq: count(m.seq, 'seq'),
    commits: commits(m.commits),
    cut: hash(m.cut, 'cut', true),
    sig: text(m.sig, 'sig'),
  };
  for (const k of Object.keys(r) as (keyof WorkRecord)[]) if (r[k] === undefined) delete r[k];
  return r;
}

/** What the receiver of a result knows it asked for and got: the record must say the same. */
export interface Expectation {
  job: string;
  peer: string;
  kind: RecordKind;
  step: number;
  micro: number;
  /** The hash of what it sent (the predecessor's output: the chain). */
  input?: string;
  /** The hash of what came back (as computed: the record's `output`). */
  output?: string;
  /** The hash of what came back as decoded after its codec (the record's `sent`). */
  sent?: string;
  /** The weights the worker's last step produced (the chain across steps). */
  weights?: string;
  /** The section's global layer range the worker was assigned. */
  stage?: [number, number];
  /** A backward: the hash of the input its forward was sent. */
  from?: string;
  /** A decoding step: the hash of the positions (and key mask) it was sent. */
  aux?: string;
  /** A decoding step's session. */
  session?: string;
  /** A step: the learning rate and clipping scale it was told. */
  lr?: number;
  scale?: number;
}

/**
 * Checks a record on arrival: signed by the worker that answered, about this job, this
 * computation, the input it was given and the output it returned. A mismatch is a
 * VerificationError naming the field: a worker cannot lie about what it was given.
 * @example
 * checkRecord(record, publicKey, { job, peer, kind: 'forward', step, micro, input: hashOfWhatWasSent, output: hashOfWhatCame })
 */
export function checkRecord(record: WorkRecord, publicKey: Uint8Array, expect: Expectation): void {
  const fail = (what: string) => {
    throw new VerificationError(`${expect.peer}: the record of ${expect.kind} ${expect.step}:${expect.micro} ${what}`, {
      details: { peer: expect.peer, kind: expect.kind, step: expect.step, micro: expect.micro },
    });
  };
  if (record.peer !== expect.peer) fail(`is signed as ${record.peer}`);
  if (!signatureValid(record, publicKey)) fail('has a signature that is not its key\'s');
  if (record.job !== expect.job || record.kind !== expect.kind || record.step !== expect.step || record.micro !== expect.micro) {
    fail(`describes ${record.kind} ${record.step}:${record.micro} of job ${record.job}`);
  }
  if (expect.input !== undefined && record.input !== expect.input) fail('names an input other than the one it was sent');
  if (expect.output !== undefined && record.output !== expect.output) fail('names an output other than the one it returned');
  if (expect.sent !== undefined && (record.sent ?? record.output) !== expect.sent) fail('names a sent result other than the one that came');
  if (expect.weights !== undefined && record.weights !== expect.weights) fail('names weights other than its last step (or average) produced');
  if (expect.stage !== undefined && (record.stage[0] !== expect.stage[0] || record.stage[1] !== expect.stage[1])) {
    fail(`is about layers [${record.stage}) while the worker holds [${expect.stage})`);
  }
  if (expect.from !== undefined && record.from !== expect.from) fail('differentiates a forward input other than the one it was sent');
  if (expect.aux !== undefined && record.aux !== expect.aux) fail('names positions other than the ones it was sent');
  if (expect.session !== undefined && record.session !== expect.session) fail('names another session');
  if (expect.lr !== undefined && record.lr !== expect.lr) fail(`stepped at lr ${record.lr}, not the ${expect.lr} it was told`);
  if (expect.scale !== undefined && record.scale !== expect.scale) fail(`scaled its gradients by ${record.scale}, not the ${expect.scale} it was told`);
}
