import { TraceError } from '../errors.ts';
import type { Backend } from './backends/backend.ts';
import { getBackend } from './backends/select.ts';
import type { Device } from './device.ts';
import { activeRecorder, isPlainObject, type OpRecorder, setRecorder } from './dispatch.ts';
import type { DType } from './dtype.ts';
import { Tensor } from './tensor.ts';

/**
 * Traced steps (after tinygrad's TinyJit): `trace(fn, inputs)` runs `fn` once and records the
 * public ops it calls (the outermost ones: an op built of other ops is one entry), each with
 * its tensor arguments as slots (the step's inputs, constants such as parameters, or the
 * results of earlier ops), its other arguments as attributes, and its results as new slots.
 * `step.run(newInputs)` replays them with new inputs of the same shapes: op by op on the js
 * and ort backends (bit for bit what calling `fn` gives on js), or as one program on a backend
 * that takes the whole step (Backend.compileStep).
 *
 * What a trace records is exactly the ops; anything else `fn` does is done once, at trace time:
 * - Host code between ops runs once: a tensor built from values `fn` read out of a traced
 *   tensor (`.data`) becomes a constant. `item()` and `toArray()` of a traced value are refused
 *   (TraceError); reading `.data` cannot be caught, so keep `fn` to ops, or make the host code
 *   an op of its own (compositeOp, dispatch.ts: a replay runs it again, as a mixture of
 *   experts' routing in src/models/moe.ts does).
 * - Tensors that are neither inputs nor results of recorded ops (parameters, masks, tables)
 *   are constants, read by reference at every run: an optimizer's in-place update is seen.
 * - State mutated in place outside the ops (the models' growing KV cache, TimeMajorKV) is an
 *   attribute, taken as it was at trace time (a plain object's fields by value, arrays and class
 *   instances by reference): a traced decoding step takes its cache as tensor inputs and
 *   returns the grown cache as outputs (cat), as ONNX graphs bind past and present. The models
 *   step aside while a trace records (isTracing): their cache is tensors joined with `cat`,
 *   and the fused decoding step on plain buffers is not taken.
 * - A random op (dropout) holds its generator as an attribute: a replay draws the next numbers
 *   from it, as another call would.
 * - A training step traces whole: `loss.backward()` is one op (a replay runs backward through
 *   the graph its own forward recorded, into the parameters' `.grad`), and so are an optimizer's
 *   `step()`, `zeroGrad()` and `releaseGrads()` (nn/optim: a replay updates the parameters in
 *   place again). Other host state (a scheduler's learning rate) is taken as traced.
 * - Not supported yet (each a TraceError): an async `fn`; a trace inside a trace; moving a
 *   traced value between devices.
 */

/** Where a slot's first value came from. */
export type SlotKind = 'input' | 'constant' | 'result';

/** One value of a traced step: its kind, shape, dtype and device as traced; constants keep their tensor. */
export interface Slot {
  readonly kind: SlotKind;
  readonly shape: readonly number[];
  readonly dtype: DType;
  readonly device: Device;
  /** The tensor itself, for a constant (read at each run); null otherwise. */
  readonly tensor: Tensor | null;
}

/** A tensor's place in a traced op's arguments or results: the index of its slot. */
export class SlotRef {
  constructor(readonly slot: number) {}
}

/** One recorded op call. */
export interface TracedOp {
  /** The public op's name, as it gives it to `hook` ('matmul', 'layerNorm', 'cat', ...). */
  readonly op: string;
  /** Its arguments with every tensor replaced by a SlotRef (in arrays and plain objects too); the rest are attributes. */
  readonly args: readonly unknown[];
  /** What it returned, tensors replaced by SlotRefs (a tensor, an array of them, ...). */
  readonly outputs: unknown;
  /** The slots it reads and writes, in argument and result order. */
  readonly inputSlots: readonly number[];
  readonly outputSlots: readonly number[];
  /** The public op itself, to replay it: `op.run(...args)` with the slots' tensors in place. */
  readonly run: (...args: unknown[]) => unknown;
}

/** A backend's program for a whole step (Backend.compileStep): inputs in, the step's outputSlots out. */
export interface CompiledStep {
  run(inputs: readonly Tensor[]): readonly Tensor[];
}

/** `value` with every leaf (what `isLeaf` says is one) replaced by `f(leaf)`, through arrays and plain objects. */
function mapLeaves<L>(value: unknown, isLeaf: (v: unknown) => v is L, f: (leaf: L) => unknown): unknown {
  if (isLeaf(value)) return f(value);
  if (Array.isArray(value)) return value.map((v) => mapLeaves(v, isLeaf, f));
  if (isPlainObject(value)) {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = mapLeaves(v, isLeaf, f);
    return out;
  }
  return value;
}

const isTensorValue = (v: unknown): v is Tensor => v instanceof Tensor;
const isSlotRef = (v: unknown): v is SlotRef => v instanceof SlotRef;

/** Replaces every tensor in `value` (in arrays and plain objects) by what `f` makes of it. */
function mapTensors(value: unknown, f: (t: Tensor) => unknown): unknown {
  return mapLeaves(value, isTensorValue, f);
}

/** Replaces every SlotRef in a template by the slot's value. */
function fill(template: unknown, values: readonly (Tensor | undefined)[]): unknown {
  return mapLeaves(template, isSlotRef, (ref) => values[ref.slot]);
}

/** Stores what an op returned into the slots its template names. */
function bind(template: unknown, out: unknown, values: (Tensor | undefined)[], op: string): void {
  if (template instanceof SlotRef) {
    if (!(out instanceof Tensor)) throw new TraceError(`'${op}' returned something else than a tensor when replayed`);
    values[template.slot] = out;
  } else if (Array.isArray(template)) {
    if (!Array.isArray(out) || out.length !== template.length) throw new TraceError(`'${op}' returned another structure when replayed`);
    template.forEach((t, i) => bind(t, out[i], values, op));
  } else if (isPlainObject(template)) {
    if (!isPlainObject(out)) throw new TraceError(`'${op}' returned another structure when replayed`);
    for (const [k, t] of Object.entries(template)) bind(t, out[k], values, op);
  }
}

class Recording implements OpRecorder {
  readonly slots: Slot[] = [];
  readonly ops: TracedOp[] = [];
  private readonly ids = new Map<Tensor, number>();

  constructor(inputs: readonly Tensor[]) {
    for (const t of inputs) {
      if (this.ids.has(t)) throw new TraceError('the same tensor is given twice as an input: pass each input once');
      this.add('input', t);
    }
  }

  add(kind: SlotKind, t: Tensor): number {
    const slot = this.slots.length;
    this.slots.push({ kind, shape: t.shape, dtype: t.dtype, device: t.device, tensor: kind === 'constant' ? t : null });
    this.ids.set(t, slot);
    return slot;
  }

  slotOf(t: Tensor): number {
    return this.ids.get(t) ?? this.add('constant', t);
  }

  record(op: string, run: (...args: never[]) => unknown, args: readonly unknown[], out: unknown): void {
    const inputSlots: number[] = [];
    const outputSlots: number[] = [];
    const argTemplate = mapTensors(args, (t) => {
      const slot = this.slotOf(t);
      inputSlots.push(slot);
      return new SlotRef(slot);
    }) as unknown[];
    const outputs = mapTensors(out, (t) => {
      const slot = this.add('result', t);
      outputSlots.push(slot);
      return new SlotRef(slot);
    });
    this.ops.push({ op, args: argTemplate, outputs, inputSlots, outputSlots, run: run as (...args: unknown[]) => unknown });
  }

  checkRead(t: Tensor, what: string): void {
    const slot = this.ids.get(t);
    if (slot !== undefined && this.slots[slot].kind !== 'constant') {
      throw new TraceError(`${what} of a value the trace computes: a replay would not repeat what follows from it; keep the traced function to ops`);
    }
  }
}

/**
 * The ops of one call of a function, to run again with new inputs (see trace()).
 */
export class TracedStep<R = unknown> {
  /** Every value of the step: inputs first (slots 0 … n − 1), then constants and results as met. */
  readonly slots: readonly Slot[];
  readonly ops: readonly TracedOp[];
  /** How many inputs `run` takes (their slots are 0 … inputCount − 1). */
  readonly inputCount: number;
  /** What the function returned, tensors replaced by SlotRefs. */
  readonly outputTemplate: unknown;
  /** The result slots the function returned (each once, in order): what a compiled step produces. */
  readonly outputSlots: readonly number[];
  /** Per op, the slots whose last reader it is (freed after it while replaying). */
  private readonly lastUses: readonly (readonly number[])[];
  private readonly compiled = new Map<Backend, CompiledStep | null>();

  /** @internal Made by trace(). */
  constructor(recording: Recording, inputCount: number, outputTemplate: unknown) {
    this.slots = recording.slots;
    this.ops = recording.ops;
    this.inputCount = inputCount;
    this.outputTemplate = outputTemplate;
    const returned = new Set<number>();
    collectSlots(outputTemplate, returned);
    this.outputSlots = [...returned].filter((s) => this.slots[s].kind === 'result');
    const last = new Map<number, number>();
    this.ops.forEach((op, i) => {
      for (const s of op.inputSlots) last.set(s, i);
    });
    const lastUses: number[][] = this.ops.map(() => []);
    for (const [slot, i] of last) if (this.slots[slot].kind === 'result' && !returned.has(slot)) lastUses[i].push(slot);
    this.lastUses = lastUses;
  }

  /**
   * Runs the step again with new inputs (same count, shapes and dtypes as traced): op by op,
   * or through the program the inputs' backend made of it (Backend.compileStep).
   * @example
   * const { step } = trace((x) => mlp.forward(x), [x0])
   * const y1 = step.run([x1]) // bit for bit mlp.forward(x1) on js
   */
  run(inputs: readonly Tensor[]): R {
    const values = this.start(inputs);
    const compiled = this.compiledFor(inputs);
    if (compiled !== null) {
      const outs = compiled.run(inputs);
      this.outputSlots.forEach((s, i) => (values[s] = outs[i]));
      return fill(this.outputTemplate, values) as R;
    }
    return this.eager(values);
  }

  /**
   * Runs the step op by op even where its backend compiled it, calling `onOp(i, op, outputs)` after
   * op i with the tensors it wrote (its outputSlots' values, in order): every intermediate value of
   * one run, for a commitment to them (a dispute's leaves, verify/dispute.ts). Values are freed after
   * their last reader as in `run`; `onOp` reads them before that.
   */
  replay(inputs: readonly Tensor[], onOp: (i: number, op: TracedOp, outputs: readonly Tensor[]) => void): R {
    return this.eager(this.start(inputs), onOp);
  }

  /** The slots' values before the first op: the inputs (checked against the trace's) and the constants. */
  private start(inputs: readonly Tensor[]): (Tensor | undefined)[] {
    if (activeRecorder() !== null) throw new TraceError('a traced step cannot run inside another trace yet');
    this.checkInputs(inputs);
    const values: (Tensor | undefined)[] = new Array<Tensor | undefined>(this.slots.length);
    inputs.forEach((t, i) => (values[i] = t));
    this.slots.forEach((s, i) => {
      if (s.kind === 'constant') values[i] = s.tensor ?? undefined;
    });
    return values;
  }

  /** Every op in order on `values`, each value freed after its last reader (`onOp` sees an op's outputs first). */
  private eager(values: (Tensor | undefined)[], onOp?: (i: number, op: TracedOp, outputs: readonly Tensor[]) => void): R {
    this.ops.forEach((op, i) => {
      bind(op.outputs, op.run(...(fill(op.args, values) as unknown[])), values, op.op);
      onOp?.(i, op, op.outputSlots.map((s) => values[s]!));
      for (const s of this.lastUses[i]) values[s] = undefined;
    });
    return fill(this.outputTemplate, values) as R;
  }

  /**
   * Runs op i alone on the values given for its input slots (`inputs`: slot → tensor; a constant
   * not given is read as traced): its outputs, in outputSlots order. What a referee re-runs.
   */
  runOp(i: number, inputs: ReadonlyMap<number, Tensor>): Tensor[] {
    const op = this.ops[i];
    if (op === undefined) throw new TraceError(`this step has ${this.ops.length} ops, not an op ${i}`);
    const values: (Tensor | undefined)[] = new Array<Tensor | undefined>(this.slots.length);
    for (const s of op.inputSlots) {
      const t = inputs.get(s) ?? (this.slots[s].kind === 'constant' ? this.slots[s].tensor ?? undefined : undefined);
      if (t === undefined) throw new TraceError(`op ${i} ('${op.op}') reads slot ${s}, which was not given`);
      values[s] = t;
    }
    bind(op.outputs, op.run(...(fill(op.args, values) as unknown[])), values, op.op);
    return op.outputSlots.map((s) => values[s]!);
  }

  private checkInputs(inputs: readonly Tensor[]): void {
    if (inputs.length !== this.inputCount) throw new TraceError(`this step takes ${this.inputCount} inputs, got ${inputs.length}`);
    inputs.forEach((t, i) => {
      const s = this.slots[i];
      if (t.dtype !== s.dtype || t.shape.length !== s.shape.length || t.shape.some((d, j) => d !== s.shape[j])) {
        throw new TraceError(`input ${i} is ${t.dtype} [${t.shape}]; the step was traced with ${s.dtype} [${s.shape}]`);
      }
    });
  }

  private compiledFor(inputs: readonly Tensor[]): CompiledStep | null {
    const backend = inputs[0]?.deviceStorage?.backend ?? getBackend();
    if (backend.compileStep === undefined) return null;
    let compiled = this.compiled.get(backend);
    if (compiled === undefined) {
      compiled = backend.compileStep(this as TracedStep) ?? null;
      this.compiled.set(backend, compiled);
    }
    return compiled;
  }
}

function collectSlots(template: unknown, into: Set<number>): void {
  mapLeaves(template, isSlotRef, (ref) => into.add(ref.slot));
}

/**
 * Records the ops one call of `fn(...inputs)` runs, for `step.run(newInputs)` to replay
 * (see the top of trace.ts for what is and is not recorded); returns the step and what the
 * call returned. `fn` returns tensors: one, an array, or a plain object of them.
 * @example
 * // a decoding step with its KV cache as inputs and outputs
 * const { step, output } = trace((x, pastK, pastV) => block.step(x, pastK, pastV), [x, k0, v0])
 * const [y, k1, v1] = step.run([x1, ...output.slice(1)])
 */
export function trace<R>(fn: (...inputs: Tensor[]) => R, inputs: readonly Tensor[]): { step: TracedStep<R>; output: R } {
  if (activeRecorder() !== null) throw new TraceError('a trace inside another trace is not supported yet');
  const recording = new Recording(inputs);
  const previous = setRecorder(recording);
  let output: R;
  try {
    output = fn(...inputs);
  } finally {
    setRecorder(previous);
  }
  if (typeof (output as { then?: unknown } | null)?.then === 'function') {
    throw new TraceError('the traced function returned a promise: a trace records a synchronous function');
  }
  const template = mapTensors(output, (t) => new SlotRef(recording.slotOf(t)));
  return { step: new TracedStep<R>(recording, inputs.length, template), output };
}
