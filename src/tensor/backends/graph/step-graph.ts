import { isPlainObject } from '../../dispatch.ts';
import { SlotRef, type TracedStep } from '../../trace.ts';
import { encodeModel, type ValueInfo } from '../ort/onnx-graph.ts';
import { CannotLower, GraphBuilder, GraphValue, ONNX_TYPE, type ValueType } from './builder.ts';
import { loweringOf } from './lowerings.ts';
import { type HostEffects, type HostFeed, StepTraining, type TrainingEntry } from './step-training.ts';

/**
 * A traced step (trace.ts) written as one ONNX graph, through the lowerings of its ops: the
 * step's inputs and the constants it reads (parameters, masks) are the graph's inputs, fed at
 * each run (so an optimizer's update between runs is seen), and the results it returns are
 * the graph's outputs. A compact weight that a lowering takes as packed bytes (MatMulNBits)
 * is stored in the graph instead, as it never changes. One op call lowers the same way
 * (`lowerCall`): a device backend runs it as a graph of its own.
 */

/** A graph input: the slot it is fed from (an input of the step or a constant). */
export interface GraphInput {
  name: string;
  slot: number;
}

/** A graph output: the slot it fills, with its shape and type. */
export interface GraphOutput {
  name: string;
  slot: number;
  shape: readonly number[];
  type: ValueType;
}

export interface StepGraph {
  model: Uint8Array;
  inputs: readonly GraphInput[];
  outputs: readonly GraphOutput[];
  /**
   * A training step's (step-training.ts) outputs after `outputs`: gradients the backend adds into a parameter's
   * `.grad`, and new values it writes over a parameter or an optimizer's state buffer, in place.
   */
  training: readonly TrainingEntry[];
  /** Inputs besides the slots: buffers read at each run (an optimizer's moments) and host values computed before it. */
  extraInputs: readonly { name: string; source: Float32Array; shape: readonly number[] }[];
  feeds: readonly HostFeed[];
  /** What the runner does on the host around a run: guards before it, gradients left cleared after it. */
  effects: HostEffects;
}

/** Why a step or call was not lowered: the op, and what its lowering said. */
export interface Refusal {
  refused: string;
}

export function mapLeaves(value: unknown, isLeaf: (v: unknown) => boolean, f: (leaf: unknown) => unknown): unknown {
  if (isLeaf(value)) return f(value);
  if (Array.isArray(value)) return value.map((v) => mapLeaves(v, isLeaf, f));
  if (isPlainObject(value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, mapLeaves(v, isLeaf, f)]));
  return value;
}

const sameShape = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((d, i) => d === b[i]);

export const info = (v: { name: string; shape: readonly number[]; type: ValueType }): ValueInfo =>
  ({ name: v.name, type: ONNX_TYPE[v.type], shape: [...v.shape] });

/** Graph values that are outputs must be distinct and not the graph's inputs: those get an Identity of their own. */
export function distinctOutputs(g: GraphBuilder, values: readonly GraphValue[], inputNames: ReadonlySet<string>): GraphValue[] {
  const seen = new Set<string>();
  return values.map((v) => {
    const taken = inputNames.has(v.name) || seen.has(v.name) || g.initializers.some((i) => i.name === v.name);
    const out = taken ? g.node('Identity', [v]) : v;
    seen.add(out.name);
    return out;
  });
}

/** The names the nodes read, to declare as inputs only what the graph uses. */
export function usedNames(g: GraphBuilder): Set<string> {
  return new Set(g.nodes.flatMap((n) => n.inputs));
}

/**
 * The step as one ONNX graph, or the reason it cannot be (an op without a lowering, a
 * float64 value, a call its lowering refuses).
 * @example
 * const lowered = lowerStep(step)
 * if (!('refused' in lowered)) ort.session(lowered.model, threads, false)
 */
export function lowerStep(step: TracedStep): StepGraph | Refusal {
  const g = new GraphBuilder();
  const values: (GraphValue | undefined)[] = new Array(step.slots.length);
  for (const [i, s] of step.slots.entries()) {
    if (s.dtype === 'float64') return { refused: `slot ${i} is float64: graphs compute in float32` };
    if (s.kind === 'input') values[i] = g.know(new GraphValue(`in${i}`, s.shape, s.dtype));
    else if (s.kind === 'constant') values[i] = g.know(new GraphValue(`const${i}`, s.shape, s.dtype, s.tensor));
  }
  // the graph's inputs as declared (an optimizer's update in the step later replaces a parameter's value in `values`)
  const fed = [...values];
  const training = new StepTraining(g, values, step);
  for (const op of step.ops) {
    if (StepTraining.OPS.has(op.op)) {
      const why = training.lower(op.op, op.args);
      if (why !== null) return { refused: why };
      continue;
    }
    const args = mapLeaves(op.args, (v) => v instanceof SlotRef, (ref) => values[(ref as SlotRef).slot]) as unknown[];
    const lowered = lowerOne(g, op.op, args);
    if ('refused' in lowered) return lowered;
    const bound = bindOutputs(op.outputs, lowered.out, values, step);
    if (bound !== null) return { refused: `'${op.op}': ${bound}` };
  }
  // an output that is an input or a constant itself (a lowering that changed nothing) gets an Identity of its own
  const fedNames = new Set(step.slots.flatMap((s, i) => (s.kind === 'result' ? [] : [fed[i]!.name])));
  const trained = training.outputs();
  const all = distinctOutputs(g, [...step.outputSlots.map((s) => values[s]!), ...trained.map((t) => t.value)], fedNames);
  const results = all.slice(0, step.outputSlots.length);
  const used = usedNames(g);
  const inputs: GraphInput[] = [];
  for (const [slot, s] of step.slots.entries()) {
    const v = fed[slot];
    if (s.kind !== 'result' && v !== undefined && used.has(v.name)) inputs.push({ name: v.name, slot });
  }
  const outputs = step.outputSlots.map((slot, i) => ({ name: results[i].name, slot, shape: results[i].shape, type: results[i].type }));
  const extraInputs = training.extraInputs.filter((e) => used.has(e.value.name))
    .map((e) => ({ name: e.value.name, source: e.source, shape: e.value.shape }));
  const feeds = training.feeds.filter((f) => used.has(f.name));
  const inputInfos = [...inputs.map((i) => info(fed[i.slot]!)), ...[...extraInputs, ...feeds].map((e) => info({ ...e, type: 'float32' }))];
  const trainingOutputs = all.slice(step.outputSlots.length)
    .map((v, i) => ({ kind: trained[i].kind, target: trained[i].target, name: v.name, shape: v.shape }) as TrainingEntry);
  const declared = [...outputs.map(info), ...trainingOutputs.map((o) => info({ ...o, type: 'float32' }))];
  const model = encodeModel(g.nodes, inputInfos, declared, 17, { initializers: g.initializers, opsets: g.opsets });
  return { model, inputs, outputs, training: trainingOutputs, extraInputs, feeds, effects: training.effects };
}

/** One op's lowering written into `g` with `args` (graph values in place of tensors): what it returns, or why not. */
export function lowerOne(g: GraphBuilder, op: string, args: readonly unknown[]): { out: unknown } | Refusal {
  const lower = loweringOf(op);
  if (lower === undefined) return { refused: `'${op}' has no lowering` };
  try {
    return { out: lower(g, ...args) };
  } catch (err) {
    if (err instanceof CannotLower) return { refused: `'${op}': ${err.message}` };
    throw err;
  }
}

/** Binds a lowering's result to the op's output template, checking every shape; returns what went wrong, or null. */
function bindOutputs(template: unknown, out: unknown, values: (GraphValue | undefined)[], step: TracedStep): string | null {
  if (template instanceof SlotRef) {
    if (!(out instanceof GraphValue)) return 'its lowering returned something else than a value';
    const slot = step.slots[template.slot];
    if (!sameShape(out.shape, slot.shape)) return `its lowering made [${out.shape}] where the trace has [${slot.shape}]`;
    if (out.type !== slot.dtype) return `its lowering made ${out.type} where the trace has ${slot.dtype}`;
    values[template.slot] = out;
    return null;
  }
  if (Array.isArray(template)) {
    if (!Array.isArray(out) || out.length !== template.length) return 'its lowering returned another structure';
    for (const [i, t] of template.entries()) {
      const why = bindOutputs(t, out[i], values, step);
      if (why !== null) return why;
    }
    return null;
  }
  if (isPlainObject(template)) {
    if (!isPlainObject(out)) return 'its lowering returned another structure';
    for (const [k, t] of Object.entries(template)) {
      const why = bindOutputs(t, out[k], values, step);
      if (why !== null) return why;
    }
  }
  return null;
}
