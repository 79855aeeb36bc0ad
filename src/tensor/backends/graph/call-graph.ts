import { isPlainObject } from '../../dispatch.ts';
import { Tensor } from '../../tensor.ts';
import { encodeModel } from '../ort/onnx-graph.ts';
import { CannotLower, GraphBuilder, GraphValue } from './builder.ts';
import { differentiate } from './gradients.ts';
import { distinctOutputs, type GraphOutput, info, lowerOne, mapLeaves, type Refusal, usedNames } from './step-graph.ts';

/**
 * One op call as a graph of its own (a device backend's eager ops: webgpu's runOp), and the graph of its gradient
 * (the call's lowering differentiated, gradients.ts), which a device backend's autograd node runs in backward.
 */

/** One op call as a graph: the call's tensors it reads, and its result as a template of graph outputs. */
export interface CallGraph {
  model: Uint8Array;
  /**
   * The graph inputs it reads, each named x<i> for the i-th tensor of the call (callTensors); a gradient graph also
   * reads x<n>, the output's gradient, after the call's n tensors.
   */
  inputNames: readonly string[];
  /** What the op returns (or, for a gradient graph, one entry per call tensor), each tensor replaced by an OutputIndex. */
  result: unknown;
  outputs: readonly GraphOutput[];
  /** A key for the graph: the op, its attributes, and its inputs' shapes and types (calls with the same key share it). */
  key: string;
}

/** Where a call's result has a tensor: the index of the graph output that holds it. */
export class OutputIndex {
  constructor(readonly index: number) {}
}

interface BuiltCall {
  g: GraphBuilder;
  /** The call's tensors as graph inputs x0, x1, … */
  values: GraphValue[];
  out: unknown;
}

function buildCall(op: string, args: readonly unknown[]): BuiltCall | Refusal {
  const g = new GraphBuilder();
  const values: GraphValue[] = [];
  const valueArgs = mapLeaves(args, (v) => v instanceof Tensor, (t) => {
    const x = t as Tensor;
    return values[values.push(g.know(new GraphValue(`x${values.length}`, x.shape, x.dtype, x))) - 1];
  }) as unknown[];
  if (values.some((v) => v.type === 'float64')) return { refused: `'${op}' of float64 values: graphs compute in float32` };
  const lowered = lowerOne(g, op, valueArgs);
  if ('refused' in lowered) return lowered;
  return { g, values, out: lowered.out };
}

/** Encodes a built call with `produced` as its outputs and `fed` as the inputs it may read. */
function finish(g: GraphBuilder, fed: readonly GraphValue[], produced: readonly GraphValue[], result: unknown, key: string): CallGraph {
  const used = usedNames(g);
  const inputs = fed.filter((v) => used.has(v.name) || produced.some((p) => p.name === v.name));
  const results = distinctOutputs(g, produced, new Set(inputs.map((v) => v.name)));
  const outputs = results.map((v, i) => ({ name: v.name, slot: i, shape: v.shape, type: v.type }));
  const model = encodeModel(g.nodes, inputs.map(info), outputs.map(info), 17, { initializers: g.initializers, opsets: g.opsets });
  return { model, inputNames: inputs.map((v) => v.name), result, outputs, key };
}

/**
 * One call of op `op` with `args` (tensors among them) as a graph of its own, or why not.
 * @example
 * lowerCall('matmul', [a, b]) // { model, inputNames: ['x0', 'x1'], outputs: [{ name, shape, type }], … }
 */
export function lowerCall(op: string, args: readonly unknown[]): CallGraph | Refusal {
  const built = buildCall(op, args);
  if ('refused' in built) return built;
  const produced: GraphValue[] = [];
  const result = mapLeaves(built.out, (v) => v instanceof GraphValue, (v) => new OutputIndex(produced.push(v as GraphValue) - 1));
  return finish(built.g, built.values, produced, result, callKey(op, args));
}

/**
 * The gradient of one call: a graph that reads the call's tensors (x0 … x<n-1>) and the gradient of its `output`-th
 * result tensor (x<n>), and gives the gradient of each call tensor that `needs` marks (the result: one entry per call
 * tensor, an OutputIndex or null where none is needed or the output does not depend on it). Or why not: a node
 * without a gradient rule, a compact weight.
 * @example
 * lowerCallGradient('matmul', [a, b], 0, [true, true]) // reads x0 = a, x1 = b, x2 = dy; result [OutputIndex(0), OutputIndex(1)]
 */
export function lowerCallGradient(op: string, args: readonly unknown[], output: number, needs: readonly boolean[]): CallGraph | Refusal {
  const built = buildCall(op, args);
  if ('refused' in built) return built;
  const { g, values } = built;
  const leaves: GraphValue[] = [];
  mapLeaves(built.out, (v) => v instanceof GraphValue, (v) => leaves.push(v as GraphValue));
  const y = leaves[output];
  const dy = g.know(new GraphValue(`x${values.length}`, y.shape, y.type));
  let grads: (GraphValue | null)[];
  try {
    grads = differentiate(g, values.filter((_, i) => needs[i]), [[y, dy]]);
  } catch (err) {
    if (err instanceof CannotLower) return { refused: `the gradient of '${op}': ${err.message}` };
    throw err;
  }
  const produced: GraphValue[] = [];
  let next = 0;
  const result = values.map((_, i) => {
    if (!needs[i]) return null;
    const grad = grads[next++];
    return grad === null ? null : new OutputIndex(produced.push(grad) - 1);
  });
  return finish(g, [...values, dy], produced, result, `grad(${output}:${needs.map(Number).join('')})|${callKey(op, args)}`);
}

/** Tensors of a call that the engine's op takes no gradient for (tables), by their index among the call's tensors. */
const NO_GRADIENT: Readonly<Record<string, readonly number[]>> = { rotaryEmbedding: [1, 2] };

/** Which of a call's tensors need a gradient: those that require one, less the ones its op treats as constants (NO_GRADIENT). */
export function gradientNeeds(op: string, tensors: readonly Tensor[]): boolean[] {
  const constant = NO_GRADIENT[op] ?? [];
  return tensors.map((t, i) => t.requiresGrad && !constant.includes(i));
}

const ids = new WeakMap<object, number>();
let nextId = 0;
/** A number per object whose content a graph may hold (a compact weight's bytes, a module's weights): their graphs differ. */
function idOf(t: object): number {
  let id = ids.get(t);
  if (id === undefined) ids.set(t, (id = nextId++));
  return id;
}

/**
 * The key of a call's graph, without lowering it: the op, its tensors' types and shapes (and which compact weight, whose
 * bytes a graph holds), its other arguments by value, and an object that is not plain data (a module whose weights a
 * lowering stores) by identity. Calls with the same key share a graph.
 * @example
 * callKey('matmul', [a, b]) // 'matmul|["float32[2,3]","float32[3,4]"]'
 */
export function callKey(op: string, args: readonly unknown[]): string {
  const described = mapLeaves(args, (v) => v instanceof Tensor, (t) => {
    const x = t as Tensor;
    return `${x.dtype}[${x.shape}]${x.packed ? `#${idOf(x)}` : ''}`;
  });
  return `${op}|${JSON.stringify(described, (_k, v: unknown) =>
    (typeof v === 'object' && v !== null && !Array.isArray(v) && !isPlainObject(v) ? `@${idOf(v)}` : v))}`;
}

/** The tensors among a call's arguments, in the order lowerCall names them x0, x1, …. */
export function callTensors(args: readonly unknown[]): Tensor[] {
  const tensors: Tensor[] = [];
  mapLeaves(args, (v) => v instanceof Tensor, (t) => tensors.push(t as Tensor));
  return tensors;
}
