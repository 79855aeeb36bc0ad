import { InvalidMessageError } from '../errors.ts';
import type { StageExecutor } from '../pipeline/index.ts';
import { type Tensor, tensor } from '../tensor/index.ts';
import {
  gradsHash, optimizerHash, type RecordKind, recordFlops, type RecordSigner, type SectionCost, signRecord, type WorkFields, type WorkRecord,
  weightsHash,
} from '../verify/index.ts';

/** What a kept computation needs to be re-run: its record and the tensors it was given (and returned). */
export interface KeptComputation {
  record: WorkRecord;
  input?: Tensor;
  grad?: Tensor;
  output?: Tensor;
  /** A backward's contribution to the gradients (kept on ort only, to be compared within tolerance). */
  contribution?: Map<string, Tensor>;
}

function bytesOf(c: KeptComputation): number {
  let n = 0;
  for (const t of [c.input, c.grad, c.output, ...(c.contribution?.values() ?? [])]) if (t) n += 4 * t.size;
  return n;
}

/** The state a step started from, kept until the next step: what re-running a step record needs. */
export interface StepSnapshot {
  step: number;
  weights: Map<string, Tensor>;
  moments: Map<string, { moments: Tensor; step: number }>;
  grads: Map<string, Tensor>;
}

/**
 * A training section's records: every forward, backward and optimizer step it computes is
 * signed with the worker's identity key and returned with its result; the records of the
 * current and the previous step are kept with what re-running them needs (the inputs and
 * gradients it was given, and, when `keepState`, the weights, optimizer state and gradients
 * each step started from), for a verifier the job's owner names.
 */
export class TrainingRecords {
  /** Optimizer steps taken: the step the next computations belong to. */
  step = 0;
  private seq = 0;
  private weights: string | null = null;
  private readonly kept = new Map<string, KeptComputation>();
  snapshot: StepSnapshot | null = null;

  constructor(
    readonly jobId: string,
    readonly range: [number, number],
    private readonly signer: RecordSigner,
    /** What computed the records: the CPU context's backend, or the device's where the executor runs there. */
    private readonly backendOf: () => string,
    private readonly executor: StageExecutor,
    /** Whether computations keep what re-running them needs, and steps the state they started from (verification on). */
    readonly keepState: boolean,
    /** The sha256 of the section's config, the optimizer's weight decay and the section's cost: records name them. */
    private readonly setup: { config: string; weightDecay?: number; cost: SectionCost },
    /** Bytes of kept inputs added (or, negative, freed): counted against the worker's budget. */
    private readonly account: (bytes: number) => void = () => {},
  ) {}

  /** The hash of the weights as they are now (cached until they change). */
  weightsHash(): string {
    this.weights ??= weightsHash(this.executor);
    return this.weights;
  }

  /** Weights changed outside a step (restored moments, a reset after rollback): hashes are recomputed. */
  invalidate(): void {
    this.weights = null;
  }

  /** Signs a computation of the current step over `tokens` tokens (its FLOPs follow from them). */
  /** The backend the next record names. */
  get backend(): string {
    return this.backendOf();
  }

  sign(fields: Omit<WorkFields, 'peer' | 'job' | 'stage' | 'backend' | 'seq' | 'step'> & { step?: number }, tokens = 0): WorkRecord {
    const flops = Math.round(recordFlops(fields.kind, this.setup.cost, tokens));
    const { config } = this.setup;
    const base = { job: this.jobId, stage: this.range, backend: this.backend, seq: this.seq++, step: this.step, config, flops };
    return signRecord({ ...base, ...fields }, this.signer);
  }

  /** Keeps what re-running a computation needs (only with verification on), counted against the budget. */
  keep(c: KeptComputation): void {
    if (!this.keepState) return;
    const key = keyOf(c.record.kind, c.record.step, c.record.micro);
    this.account(bytesOf(c) - (this.kept.has(key) ? bytesOf(this.kept.get(key)!) : 0));
    this.kept.set(key, c);
  }

  private drop(key: string): void {
    const c = this.kept.get(key);
    if (!c) return;
    this.kept.delete(key);
    this.account(-bytesOf(c));
  }

  /** The kept computation of a record (a typed error once it left the window). */
  find(kind: RecordKind, step: number, micro: number): KeptComputation {
    const c = this.kept.get(keyOf(kind, step, micro));
    if (!c) throw new InvalidMessageError(`no record of ${kind} ${step}:${micro} is kept (the window holds this step and the last)`);
    return c;
  }

  /** The frozen weights every record computes with beside the trained ones (a base under an adapter; never copied). */
  get frozen(): ReadonlyMap<string, Tensor> {
    return this.executor.frozen;
  }

  /** The weights a record of `step` computed with: the current ones, or those its step started from. */
  weightsAt(step: number): Map<string, Tensor> {
    if (step === this.step) return this.executor.named;
    if (this.snapshot?.step === step) return this.snapshot.weights;
    throw new InvalidMessageError(`the weights of step ${step} are no longer kept (this worker is at step ${this.step})`);
  }

  /**
   * Runs the optimizer step (or skips it: `apply` false is a stale cheat) and signs its
   * record: the gradients it stepped with, AdamW's state before and after, the weights after.
   */
  stepWith(scale: number, lr: number, apply: boolean): WorkRecord {
    const ex = this.executor;
    const grads = new Map<string, Tensor>();
    for (const [n, p] of ex.named) if (p.grad) grads.set(n, p.grad);
    const input = gradsHash(ex, grads);
    const state = optimizerHash(ex);
    const weights = this.weightsHash();
    if (this.keepState) {
      const moments = new Map<string, { moments: Tensor; step: number }>();
      for (const n of ex.named.keys()) {
        const m = ex.moments(n);
        if (m) moments.set(n, m);
      }
      this.snapshot = {
        step: this.step,
        weights: new Map([...ex.named].map(([n, p]) => [n, tensor((p.data as Float32Array).slice(), p.shape)])),
        moments,
        grads: new Map([...grads].map(([n, g]) => [n, tensor((g.data as Float32Array).slice(), g.shape)])),
      };
    }
    if (apply) ex.step(scale, lr);
    else {
      for (const p of ex.named.values()) p.grad = null;
    }
    this.weights = null;
    const wd = this.setup.weightDecay === undefined ? {} : { weightDecay: this.setup.weightDecay };
    const record = this.sign({ kind: 'step', micro: 0, input, output: this.weightsHash(), weights, state, after: optimizerHash(ex), scale, lr, ...wd });
    this.keep({ record });
    // the window: this step's computations and the step record stay; older ones go
    for (const [k, c] of [...this.kept]) if (c.record.step < this.step) this.drop(k);
    this.step++;
    return record;
  }

  /** Forgets everything kept (the job ends). */
  clear(): void {
    for (const k of [...this.kept.keys()]) this.drop(k);
    this.snapshot = null;
  }

  /** Forgets computations of a step that failed (its records are void). */
  dropStep(): void {
    for (const [k, c] of [...this.kept]) if (c.record.step === this.step && c.record.kind !== 'step') this.drop(k);
  }
}

function keyOf(kind: RecordKind, step: number, micro: number): string {
  return `${kind}:${step}:${micro}`;
}
