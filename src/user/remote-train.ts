import { randomBytes } from 'node:crypto';
import {
  parseGradSquares, parseMomentSteps, parsePassedAnswer, parseSyncedAnswer, parseTrainReady, publicKeyOf, type StageAssignment,
  TRAIN_REQUEST_TIMEOUT_MS,
  type Traffic, newTraffic, parseTraffic, type WireActivationCodec, type WireTensor,
} from '../p2p/index.ts';
import { type Activation, isPassed, REDUCE_TIMEOUT_MS, type ReduceGroup, type StageHandle } from '../pipeline/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { hopIn, hopOut } from '../compress/index.ts';
import { checkRecord, hashTensors, parseRecord, type RecordKind, type WorkRecord } from '../verify/index.ts';
import { controlAnswer, type RecordedFrame, recordOf, type RemoteStage, tensorAnswer } from './remote-stage.ts';
import { InvalidMessageError } from '../errors.ts';

/** Keys of tensors passed between workers: unique to this process and never reused (a stale pass is never taken for a new one). */
const PASS_PREFIX = randomBytes(6).toString('hex');
let passCount = 0;

/** A result and the worker's signed record of it, checked on arrival. */
export interface Recorded<T> {
  value: T;
  record: WorkRecord;
}

/**
 * A section being trained on a worker, driven over the job's stage stream (the libp2p side of
 * `StageHandle`). Every forward, backward and step comes back with the worker's signed record,
 * checked on arrival: its signature, the computation asked for, the hash of the input sent
 * and of the output returned, and the weights its last step produced (the chain). Checked
 * records go to `onRecord` (the job's verifier samples them for re-execution).
 */
export class RemoteTrainStage implements StageHandle {
  names: readonly string[] = [];
  /** Optimizer steps this worker has taken: the step its next records belong to. */
  steps = 0;
  /** The weights its last step produced (or its first record named): every later record must name them. */
  private chainWeights: string | undefined;
  onRecord: ((stage: RemoteTrainStage, record: WorkRecord) => void) | null = null;
  /** The hash of each micro-batch's forward input until its backward. */
  private readonly sentInputs = new Map<number, string>();
  /** The layers it was assigned: every record must be about them. */
  private readonly range: [number, number];
  /** Other holders of its parameters name it by peer id; the worker finds the addresses in the job's assignment. */
  readonly address: string;
  readonly peerId: string;
  /** Its peer id when its neighbours may pass it tensors directly (worker to worker); unset, every tensor goes through the user. */
  direct: string | undefined = undefined;
  /** Bytes the worker sent for the job, as it reported at its last step. */
  workerTraffic: Traffic = newTraffic();
  /** How activations and their gradients travel to and from it (null: float32). */
  codec: WireActivationCodec | null = null;

  constructor(
    readonly stage: RemoteStage,
    readonly worker: StageAssignment,
    readonly label: string,
    /** A forward's or backward's deadline (ms) for `tokens` tokens: past it the worker is treated as lost (default: the protocol's). */
    private readonly deadline: ((tokens: number) => number) | null = null,
  ) {
    this.peerId = worker.peerId;
    this.address = worker.peerId;
    this.range = [worker.start, worker.end];
  }

  private call(
    header: Record<string, unknown>,
    tensors: Tensor[] | ((id: number) => WireTensor[]) = [],
    timeoutMs = TRAIN_REQUEST_TIMEOUT_MS,
  ): Promise<RecordedFrame> {
    return this.stage.call(header, tensors, timeoutMs);
  }

  /** A forward's or backward's deadline: its input's tokens (batch × time). */
  private timeout(t: Activation): number {
    return this.deadline ? this.deadline((t.shape[0] ?? 1) * (t.shape[1] ?? 1)) : TRAIN_REQUEST_TIMEOUT_MS;
  }

  /**
   * A forward's input or a backward's gradient as a request: sent with it (encoded by the codec),
   * or named by the key a neighbour passed it under; with `to`, where the result goes on. `sent`
   * is the hash the worker's record must name as its input: what it computes on.
   */
  private hop(input: Activation, to: string | undefined) {
    const key = to ? `${PASS_PREFIX}-${++passCount}` : null;
    const header = {
      ...(isPassed(input) ? { from: { peer: input.sender, key: input.key } } : {}),
      ...(to ? { to: { peer: to, key } } : {}),
      ...(this.codec ? { codec: this.codec } : {}),
    };
    if (isPassed(input)) return { header, key, tensors: [] as Tensor[], sent: input.hash };
    const { part, received } = hopOut(input, this.codec);
    return { header, key, tensors: (id: number) => [{ requestId: id, ...part }], sent: hashTensors([received]) };
  }

  /** A forward's or backward's result: the tensor (decoded), or where it went on; its record checked against it. */
  private result(
    frame: RecordedFrame,
    what: string,
    key: string | null,
    check: (output: { output?: string; sent?: string }) => WorkRecord,
  ): Recorded<Activation> {
    if (key) {
      const { shape } = parsePassedAnswer(controlAnswer(frame, what));
      const record = check({});
      return { value: { passed: true, sender: this.peerId, key, hash: record.sent ?? record.output, shape }, record };
    }
    if (frame.kind !== 'tensor') throw new InvalidMessageError(`${what}: expected a tensor`);
    const value = hopIn(frame.tensor);
    // a compressed result cannot be checked against the exact output its record names: against what it sent
    const record = check(this.codec ? { sent: hashTensors([value]) } : { output: hashTensors([value]) });
    return { value, record };
  }

  /** Parses and checks the record that came with an answer (a typed error if it is missing, forged or about something else). */
  private checked(
    frame: RecordedFrame,
    kind: RecordKind,
    micro: number,
    input: string,
    output: { output?: string; sent?: string },
    from?: string,
  ): WorkRecord {
    const record = parseRecord(recordOf(frame));
    checkRecord(record, publicKeyOf(this.peerId), {
      job: this.stage.jobId, peer: this.peerId, kind, step: this.steps, micro, input, stage: this.range,
      ...output, ...(from === undefined ? {} : { from }), weights: this.chainWeights,
    });
    this.chainWeights ??= record.weights;
    this.onRecord?.(this, record);
    return record;
  }

  /** Creates the worker's optimizer for its section; `peers` (peer ids) may send it gradients (replicas, a tied head). */
  async setup(options: {
    lr: number;
    weightDecay?: number;
    recompute?: boolean;
    keepState?: boolean;
    peers: string[];
    compressGrads?: { k: number; chunk: number; bits: number };
    syncEvery?: number;
    keepMicros?: boolean;
  }): Promise<void> {
    this.names = parseTrainReady(controlAnswer(await this.call({ type: 'train-setup', ...options }), 'train-setup'));
  }

  async forward(micro: number, input: Activation, to?: string): Promise<Activation> {
    return (await this.forwardRecorded(micro, input, to)).value;
  }

  /** A forward; with `to` (a neighbour's peer id) its output goes there and a `Passed` comes back. */
  async forwardRecorded(micro: number, input: Activation, to?: string): Promise<Recorded<Activation>> {
    const { header, key, tensors, sent } = this.hop(input, to);
    const frame = await this.call({ type: 'train-forward', micro, ...header }, tensors, this.timeout(input));
    const result = this.result(frame, 'train-forward', key, (output) => this.checked(frame, 'forward', micro, sent, output));
    this.sentInputs.set(micro, sent);
    return result;
  }

  async backward(micro: number, grad: Activation, to?: string): Promise<Activation | null> {
    return (await this.backwardRecorded(micro, grad, to)).value;
  }

  async backwardRecorded(micro: number, grad: Activation, to?: string): Promise<Recorded<Activation | null>> {
    const { header, key, tensors, sent } = this.hop(grad, to);
    const frame = await this.call({ type: 'train-backward', micro, ...header }, tensors, this.timeout(grad));
    // its backward must differentiate the forward input this micro-batch was sent
    const from = this.sentInputs.get(micro);
    this.sentInputs.delete(micro);
    if (frame.kind === 'control' && (frame.message as { type?: unknown }).type === 'no-input-gradient') {
      return { value: null, record: this.checked(frame, 'backward', micro, sent, { output: '' }, from) };
    }
    return this.result(frame, 'train-backward', key, (output) => this.checked(frame, 'backward', micro, sent, output, from));
  }

  async gradSquares(names: readonly string[]): Promise<number[]> {
    return parseGradSquares(controlAnswer(await this.call({ type: 'grad-squares', names }), 'grad-squares'), names.length);
  }

  async reduce(group: ReduceGroup): Promise<void> {
    await this.call({ type: 'reduce', ...group }, [], REDUCE_TIMEOUT_MS + 10_000);
  }

  /**
   * Averages the weights' changes since the last average with the group's other holders
   * (local steps); returns the hash of the weights it then holds, which its next records
   * must name (the user checks that every holder of the group names the same).
   */
  async sync(group: ReduceGroup): Promise<string> {
    const { weights } = parseSyncedAnswer(controlAnswer(await this.call({ type: 'sync', ...group }, [], REDUCE_TIMEOUT_MS + 10_000), 'sync'));
    this.chainWeights = weights;
    return weights;
  }

  async step(scale: number, lr: number): Promise<void> {
    await this.stepRecorded(scale, lr);
  }

  /** The optimizer step and its record: the gradients, optimizer state before and after, the weights after. */
  async stepRecorded(scale: number, lr: number): Promise<WorkRecord> {
    const frame = await this.call({ type: 'step', scale, lr });
    const answer = controlAnswer(frame, 'step');
    if (answer.traffic !== undefined) this.workerTraffic = parseTraffic(answer.traffic);
    const record = parseRecord(recordOf(frame));
    checkRecord(record, publicKeyOf(this.peerId), {
      job: this.stage.jobId, peer: this.peerId, kind: 'step', step: this.steps, micro: 0, weights: this.chainWeights, stage: this.range, lr, scale,
    });
    this.chainWeights = record.output;
    this.steps++;
    this.onRecord?.(this, record);
    return record;
  }

  /** Scoring (src/user/scoring.ts): its trained weights' change since the round's anchor, parameter by parameter. */
  async trialDelta(): Promise<Map<string, Float32Array>> {
    const out = new Map<string, Float32Array>();
    for (const name of this.names) out.set(name, (await tensorAnswer(await this.call({ type: 'trial-delta', name }), 'trial-delta')).data as Float32Array);
    return out;
  }

  /** A forward without records or training, at the round's anchor or at anchor + scale·(its change): scoring's held-out pass. */
  async trialForward(input: Tensor, weights: 'anchor' | 'current', scale = 1): Promise<Tensor> {
    return tensorAnswer(await this.call({ type: 'trial-forward', weights, scale }, [input]), 'trial-forward');
  }

  async weights(): Promise<Map<string, Tensor>> {
    const out = new Map<string, Tensor>();
    for (const name of this.names) out.set(name, await this.stage.weight(name));
    return out;
  }

  /** The parameters that have taken a step, with their step counts. */
  async momentSteps(): Promise<{ name: string; step: number }[]> {
    const steps = parseMomentSteps(controlAnswer(await this.call({ type: 'moment-steps', names: this.names }), 'moment-steps'), this.names.length);
    return this.names.flatMap((name, i) => (steps[i] === null ? [] : [{ name, step: steps[i] }]));
  }

  /** AdamW's moments of one parameter, [2, ...shape]. */
  async moments(name: string): Promise<Tensor> {
    return tensorAnswer(await this.call({ type: 'moments', name }), 'moments');
  }

  async optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>> {
    const out = new Map<string, { moments: Tensor; step: number }>();
    for (const { name, step } of await this.momentSteps()) out.set(name, { moments: await this.moments(name), step });
    return out;
  }

  async setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void> {
    for (const name of this.names) {
      const s = state.get(name);
      if (s) await this.call({ type: 'set-moments', name, step: s.step }, [s.moments]);
    }
    this.chainWeights = undefined; // the chain restarts from what the next record names
  }

  async reset(): Promise<void> {
    this.sentInputs.clear();
    await this.call({ type: 'train-reset' }, [], 10_000);
  }
}
