import type { AttributeValue } from '../ort/onnx-graph.ts';
import { type GraphBuilder, type GraphValue, refuse } from './builder.ts';
import type { GradientContext, GradientRule } from './gradients.ts';
import { broadcast, axis as positive } from './lowerings/common.ts';

/**
 * The vector-Jacobian product of each ONNX op type the lowerings write (gradients.ts walks them): given the gradient
 * of a node's outputs, the nodes that make the gradient of each input that needs one. Broadcast inputs get their
 * gradient summed back to their shape; integer inputs (indices, shapes, axes) get none.
 */

const intAttr = (v: AttributeValue | undefined, fallback: number): number => (typeof v === 'number' ? v : fallback);
const floatAttr = (v: AttributeValue | undefined, fallback: number): number =>
  typeof v === 'object' && v !== null && 'float' in v ? v.float : typeof v === 'number' ? v : fallback;

/** The int64 values of a constant input (axes, starts, split sizes), which a rule needs to know. */
function constInts(g: GraphBuilder, v: GraphValue | null, what: string): number[] {
  const data = v === null ? undefined : g.constantData(v.name);
  if (data === undefined) return refuse(`a gradient needs the ${what} as a constant`);
  return Array.from(data as ArrayLike<number | bigint>, Number);
}

const same = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((d, i) => d === b[i]);

/** ReduceSum over `axes` with keepdims (axes as an input at opset 17). */
function sum(g: GraphBuilder, x: GraphValue, axes: readonly number[]): GraphValue {
  if (axes.length === 0) return x;
  const shape = x.shape.map((d, i) => (axes.includes(i) ? 1 : d));
  return g.node('ReduceSum', [x, g.ints(axes)], { shape, type: x.type }, { keepdims: 1 });
}

/** A gradient of a broadcast result summed back to an input's shape (numpy broadcasting). */
export function unbroadcast(g: GraphBuilder, grad: GraphValue, shape: readonly number[]): GraphValue {
  if (same(grad.shape, shape)) return grad;
  const lead = grad.rank - shape.length;
  const axes: number[] = [];
  grad.shape.forEach((d, i) => {
    if (i < lead || (shape[i - lead] === 1 && d !== 1)) axes.push(i);
  });
  return g.reshape(sum(g, grad, axes), shape);
}

const zeros = (g: GraphBuilder, shape: readonly number[]): GraphValue =>
  g.node('Expand', [g.scalar(0), g.ints(shape)], { shape, type: 'float32' });

/** `grad` of a reduced value (kept dims or not) broadcast back over `shape`, the reduced axes being `axes`. */
function spread(g: GraphBuilder, grad: GraphValue, shape: readonly number[], axes: readonly number[]): GraphValue {
  const kept = g.reshape(grad, shape.map((d, i) => (axes.includes(i) ? 1 : d)));
  return g.node('Expand', [kept, g.ints(shape)], { shape, type: grad.type });
}

const mul = (g: GraphBuilder, a: GraphValue, b: GraphValue) => g.node('Mul', [a, b], { shape: broadcastOf(a, b) });
const div = (g: GraphBuilder, a: GraphValue, b: GraphValue) => g.node('Div', [a, b], { shape: broadcastOf(a, b) });
const sub = (g: GraphBuilder, a: GraphValue, b: GraphValue) => g.node('Sub', [a, b], { shape: broadcastOf(a, b) });
const neg = (g: GraphBuilder, a: GraphValue) => g.node('Neg', [a]);

const broadcastOf = (a: GraphValue, b: GraphValue): number[] => broadcast(a.shape, b.shape);

/** The two last dims swapped. */
function swapLast(g: GraphBuilder, x: GraphValue): GraphValue {
  const perm = x.shape.map((_, i) => i);
  [perm[x.rank - 2], perm[x.rank - 1]] = [perm[x.rank - 1], perm[x.rank - 2]];
  return g.node('Transpose', [x], { shape: perm.map((p) => x.shape[p]) }, { perm });
}

/** The one output's gradient of a single-output node (the walk calls a rule only when some gradient exists). */
const gy = (c: GradientContext): GraphValue => c.grads[0]!;
const inputOf = (c: GradientContext, k: number): GraphValue => c.inputs[k]!;

/** Rules for ops whose gradient is the output's, reshaped to the input's shape. */
const reshaped: GradientRule = (g, c) => [g.reshape(gy(c), inputOf(c, 0).shape), null];

const reduceAxes = (g: GraphBuilder, c: GradientContext, fromInput: boolean): number[] => {
  const x = inputOf(c, 0);
  const given = fromInput ? (c.inputs[1] ? constInts(g, c.inputs[1], 'axes') : []) : (c.node.attributes?.axes as number[] | undefined) ?? [];
  return given.length === 0 ? x.shape.map((_, i) => i) : given.map((a) => positive(a, x.rank));
};

export const GRADIENT_RULES: Readonly<Record<string, GradientRule>> = {
  Identity: (_g, c) => [gy(c)],
  Cast: (g, c) => [inputOf(c, 0).type === 'float32' ? g.cast(gy(c), 'float32') : null],
  Reshape: reshaped,
  Squeeze: reshaped,
  Unsqueeze: reshaped,
  Flatten: reshaped,
  Transpose(g, c) {
    const x = inputOf(c, 0);
    const perm = (c.node.attributes?.perm as number[] | undefined) ?? x.shape.map((_, i) => x.rank - 1 - i);
    const inverse = perm.map((_, i) => perm.indexOf(i));
    return [g.node('Transpose', [gy(c)], { shape: x.shape }, { perm: inverse })];
  },
  Expand: (g, c) => [unbroadcast(g, gy(c), inputOf(c, 0).shape), null],
  Add: (g, c) => [unbroadcast(g, gy(c), inputOf(c, 0).shape), unbroadcast(g, gy(c), inputOf(c, 1).shape)],
  Sub: (g, c) => [unbroadcast(g, gy(c), inputOf(c, 0).shape), c.needs[1] ? unbroadcast(g, neg(g, gy(c)), inputOf(c, 1).shape) : null],
  Mul(g, c) {
    const [a, b] = [inputOf(c, 0), inputOf(c, 1)];
    return [c.needs[0] ? unbroadcast(g, mul(g, gy(c), b), a.shape) : null, c.needs[1] ? unbroadcast(g, mul(g, gy(c), a), b.shape) : null];
  },
  Div(g, c) {
    const [a, b] = [inputOf(c, 0), inputOf(c, 1)];
    const ga = c.needs[0] ? unbroadcast(g, div(g, gy(c), b), a.shape) : null;
    const gb = c.needs[1] ? unbroadcast(g, neg(g, div(g, mul(g, gy(c), c.outputs[0]), b)), b.shape) : null;
    return [ga, gb];
  },
  Neg: (g, c) => [neg(g, gy(c))],
  Abs: (g, c) => [mul(g, gy(c), g.node('Sign', [inputOf(c, 0)]))],
  Reciprocal: (g, c) => [neg(g, mul(g, gy(c), mul(g, c.outputs[0], c.outputs[0])))],
  Sqrt: (g, c) => [div(g, mul(g, gy(c), g.scalar(0.5)), c.outputs[0])],
  Exp: (g, c) => [mul(g, gy(c), c.outputs[0])],
  Log: (g, c) => [div(g, gy(c), inputOf(c, 0))],
  Tanh: (g, c) => [mul(g, gy(c), sub(g, g.scalar(1), mul(g, c.outputs[0], c.outputs[0])))],
  Sigmoid: (g, c) => [mul(g, gy(c), mul(g, c.outputs[0], sub(g, g.scalar(1), c.outputs[0])))],
  Relu(g, c) {
    const x = inputOf(c, 0);
    return [g.node('Where', [g.node('Greater', [x, g.scalar(0)], { type: 'bool' }), gy(c), g.scalar(0)], { shape: x.shape, type: x.type })];
  },
  Erf(g, c) {
    const x = inputOf(c, 0);
    const bump = g.node('Exp', [neg(g, mul(g, x, x))]);
    return [mul(g, gy(c), mul(g, bump, g.scalar(2 / Math.sqrt(Math.PI))))];
  },
  Pow(g, c) {
    const [x, p] = [inputOf(c, 0), inputOf(c, 1)];
    const y = c.outputs[0];
    const gx = c.needs[0] ? unbroadcast(g, mul(g, gy(c), mul(g, p, g.node('Pow', [x, sub(g, p, g.scalar(1))], { shape: broadcastOf(x, p) }))), x.shape) : null;
    const gp = c.needs[1] ? unbroadcast(g, mul(g, gy(c), mul(g, y, g.node('Log', [x]))), p.shape) : null;
    return [gx, gp];
  },
  MatMul(g, c) {
    // a vector operand is a matrix of one row (on the left) or one column (on the right), as numpy's matmul treats it
    const [a0, b0] = [inputOf(c, 0), inputOf(c, 1)];
    const a = a0.rank === 1 ? g.reshape(a0, [1, a0.shape[0]]) : a0;
    const b = b0.rank === 1 ? g.reshape(b0, [b0.shape[0], 1]) : b0;
    const dy = gy(c);
    const [va, vb] = [a0.rank === 1, b0.rank === 1];
    const batch = dy.shape.slice(0, dy.rank - (va ? 0 : 1) - (vb ? 0 : 1));
    const rows = va ? 1 : dy.shape[dy.rank - (vb ? 1 : 2)];
    const y = g.reshape(dy, [...batch, rows, vb ? 1 : dy.shape[dy.rank - 1]]);
    const ga = c.needs[0] ? g.node('MatMul', [y, swapLast(g, b)], { shape: [...y.shape.slice(0, -1), a.shape[a.rank - 1]] }) : null;
    const gb = c.needs[1] ? g.node('MatMul', [swapLast(g, a), y], { shape: [...y.shape.slice(0, -2), b.shape[b.rank - 2], b.shape[b.rank - 1]] }) : null;
    return [ga && g.reshape(unbroadcast(g, ga, a.shape), a0.shape), gb && g.reshape(unbroadcast(g, gb, b.shape), b0.shape)];
  },
  Gemm(g, c) {
    const [a, b, bias] = [inputOf(c, 0), inputOf(c, 1), c.inputs[2] ?? null];
    const at = c.node.attributes ?? {};
    const [transA, transB] = [intAttr(at.transA, 0), intAttr(at.transB, 0)];
    const [alpha, beta] = [floatAttr(at.alpha, 1), floatAttr(at.beta, 1)];
    const y = gy(c);
    const [m, n] = y.shape;
    const k = transA ? a.shape[0] : a.shape[1];
    const t = (x: GraphValue) => g.node('Transpose', [x], { shape: [x.shape[1], x.shape[0]] }, { perm: [1, 0] });
    let ga: GraphValue | null = null;
    let gb: GraphValue | null = null;
    if (c.needs[0]) {
      const gat = g.node('Gemm', [y, b], { shape: [m, k] }, { transB: transB ? 0 : 1, alpha: { float: alpha } });
      ga = transA ? t(gat) : gat;
    }
    if (c.needs[1]) {
      const gbt = g.node('Gemm', [a, y], { shape: [k, n] }, { transA: transA ? 0 : 1, alpha: { float: alpha } });
      gb = transB ? t(gbt) : gbt;
    }
    const gc = bias !== null && c.needs[2] ? unbroadcast(g, beta === 1 ? y : mul(g, y, g.scalar(beta)), bias.shape) : null;
    return [ga, gb, gc];
  },
  Slice(g, c) {
    const x = inputOf(c, 0);
    const [starts, ends] = [constInts(g, c.inputs[1], 'starts'), constInts(g, c.inputs[2], 'ends')];
    const axes = c.inputs[3] ? constInts(g, c.inputs[3], 'axes') : starts.map((_, i) => i);
    const steps = c.inputs[4] ? constInts(g, c.inputs[4], 'steps') : starts.map(() => 1);
    if (steps.some((s) => s !== 1)) refuse('the gradient of a Slice with steps');
    const pads = new Array<number>(2 * x.rank).fill(0);
    axes.forEach((a0, i) => {
      const a = positive(a0, x.rank);
      const d = x.shape[a];
      const clamp = (v: number) => Math.min(Math.max(v < 0 ? v + d : v, 0), d);
      pads[a] = clamp(starts[i]);
      pads[x.rank + a] = d - clamp(ends[i]);
    });
    return [g.node('Pad', [gy(c), g.ints(pads), g.scalar(0)], { shape: x.shape }, { mode: 'constant' }), null, null, null, null];
  },
  Concat(g, c) {
    const d = positive(intAttr(c.node.attributes?.axis, 0), c.outputs[0].rank);
    let offset = 0;
    return c.inputs.map((x, i) => {
      const start = offset;
      offset += x!.shape[d];
      if (!c.needs[i]) return null;
      const shape = gy(c).shape.map((n, j) => (j === d ? x!.shape[d] : n));
      return g.node('Slice', [gy(c), g.ints([start]), g.ints([start + x!.shape[d]]), g.ints([d])], { shape });
    });
  },
  Split(g, c) {
    const x = inputOf(c, 0);
    const d = positive(intAttr(c.node.attributes?.axis, 0), x.rank);
    const parts = c.outputs.map((o, i) => c.grads[i] ?? zeros(g, o.shape));
    return [g.node('Concat', parts, { shape: x.shape }, { axis: d }), null];
  },
  Gather(g, c) {
    const [x, ids] = [inputOf(c, 0), inputOf(c, 1)];
    const d = positive(intAttr(c.node.attributes?.axis, 0), x.rank);
    // x's axis d first, then ScatterND adds each gradient row at its index (repeats add up)
    const permX = [d, ...x.shape.map((_, i) => i).filter((i) => i !== d)];
    const front = permX.map((p) => x.shape[p]);
    const y = gy(c);
    const idRank = ids.rank;
    const permY = [...Array.from({ length: idRank }, (_, i) => d + i), ...Array.from({ length: d }, (_, i) => i),
      ...Array.from({ length: x.rank - d - 1 }, (_, i) => d + idRank + i)];
    const rows = g.node('Transpose', [y], { shape: permY.map((p) => y.shape[p]) }, { perm: permY });
    const index = g.reshape(g.cast(ids, 'int64'), [...ids.shape, 1]);
    const scattered = g.node('ScatterND', [zeros(g, front), index, rows], { shape: front }, { reduction: 'add' });
    return [g.node('Transpose', [scattered], { shape: x.shape }, { perm: permX.map((_, i) => permX.indexOf(i)) }), null];
  },
  GatherElements(g, c) {
    const [x, ids] = [inputOf(c, 0), inputOf(c, 1)];
    const d = positive(intAttr(c.node.attributes?.axis, 0), x.rank);
    return [g.node('ScatterElements', [zeros(g, x.shape), ids, gy(c)], { shape: x.shape }, { axis: d, reduction: 'add' }), null];
  },
  TopK(g, c) {
    const x = inputOf(c, 0);
    if (c.grads[0] === null) return [null, null];
    const d = positive(intAttr(c.node.attributes?.axis, -1), x.rank);
    return [g.node('ScatterElements', [zeros(g, x.shape), c.outputs[1], c.grads[0]], { shape: x.shape }, { axis: d, reduction: 'add' }), null];
  },
  ReduceSum: (g, c) => [spread(g, gy(c), inputOf(c, 0).shape, reduceAxes(g, c, true)), null],
  ReduceMean(g, c) {
    const x = inputOf(c, 0);
    const axes = reduceAxes(g, c, false);
    const count = axes.reduce((n, a) => n * x.shape[a], 1);
    return [div(g, spread(g, gy(c), x.shape, axes), g.scalar(count))];
  },
  ReduceMax(g, c) {
    // the gradient goes to the first maximum, as js's max gives it (ArgMax takes the first of equal values)
    const x = inputOf(c, 0);
    const axes = reduceAxes(g, c, false);
    const one = axes.length === 1;
    if (!one && axes.length !== x.rank) {
      const hit = g.cast(g.node('Equal', [x, spread(g, c.outputs[0], x.shape, axes)], { type: 'bool' }), 'float32');
      return [mul(g, hit, spread(g, gy(c), x.shape, axes))];
    }
    const flat = one ? x : g.reshape(x, [1, x.size]);
    const axis = one ? axes[0] : 1;
    const kept = flat.shape.map((d, i) => (i === axis ? 1 : d));
    const first = g.node('ArgMax', [flat], { shape: kept, type: 'int64' }, { axis, keepdims: 1, select_last_index: 0 });
    const grad = g.node('ScatterElements', [zeros(g, flat.shape), first, g.reshape(gy(c), kept)], { shape: flat.shape }, { axis });
    return [g.reshape(grad, x.shape)];
  },
  Softmax(g, c) {
    const y = c.outputs[0];
    const d = positive(intAttr(c.node.attributes?.axis, -1), y.rank);
    return [mul(g, y, sub(g, gy(c), sum(g, mul(g, gy(c), y), [d])))];
  },
  LogSoftmax(g, c) {
    const y = c.outputs[0];
    const d = positive(intAttr(c.node.attributes?.axis, -1), y.rank);
    return [sub(g, gy(c), mul(g, g.node('Exp', [y]), sum(g, gy(c), [d])))];
  },
  LayerNormalization(g, c) {
    const [x, scale, bias] = [inputOf(c, 0), inputOf(c, 1), c.inputs[2] ?? null];
    if (positive(intAttr(c.node.attributes?.axis, -1), x.rank) !== x.rank - 1) refuse('the gradient of a LayerNormalization over several dims');
    const eps = floatAttr(c.node.attributes?.epsilon, 1e-5);
    const last = [x.rank - 1];
    const mean = (v: GraphValue) => g.node('ReduceMean', [v], { shape: [...v.shape.slice(0, -1), 1] }, { axes: last, keepdims: 1 });
    const centred = sub(g, x, mean(x));
    const rstd = g.node('Reciprocal', [g.node('Sqrt', [g.node('Add', [mean(mul(g, centred, centred)), g.scalar(eps)])])]);
    const xhat = mul(g, centred, rstd);
    const gxhat = mul(g, gy(c), scale);
    const gx = c.needs[0] ? mul(g, rstd, sub(g, sub(g, gxhat, mean(gxhat)), mul(g, xhat, mean(mul(g, gxhat, xhat))))) : null;
    const gs = c.needs[1] ? unbroadcast(g, mul(g, gy(c), xhat), scale.shape) : null;
    const gb = bias !== null && c.needs[2] ? unbroadcast(g, gy(c), bias.shape) : null;
    return [gx, gs, gb];
  },
  Where(g, c) {
    const [cond, a, b] = [inputOf(c, 0), inputOf(c, 1), inputOf(c, 2)];
    const zero = g.scalar(0);
    const pick = (x: GraphValue, y: GraphValue) => g.node('Where', [cond, x, y], { shape: gy(c).shape, type: gy(c).type });
    const ga = c.needs[1] ? unbroadcast(g, pick(gy(c), zero), a.shape) : null;
    return [null, ga, c.needs[2] ? unbroadcast(g, pick(zero, gy(c)), b.shape) : null];
  },
};
