import { type GraphBuilder, GraphValue, refuse, type ValueType } from '../builder.ts';
import type { LoweringTable } from '../lowerings.ts';
import { broadcast } from './common.ts';

/** Elementwise ops: add, sub, mul, div, pow, the unary functions, maskedFill, cast, clone, detach, dropout. */

function binary(op: string) {
  return (g: GraphBuilder, a: unknown, b: unknown): GraphValue => {
    const [x, y] = operands(g, a, b);
    return g.node(op, [x, y], { shape: broadcast(x.shape, y.shape), type: x.type });
  };
}

/** Both operands as graph values (a number becomes a scalar of the other's type). */
function operands(g: GraphBuilder, a: unknown, b: unknown): [GraphValue, GraphValue] {
  if (a instanceof GraphValue && b instanceof GraphValue) return [a, b];
  if (a instanceof GraphValue && typeof b === 'number') return [a, g.scalar(b, a.type)];
  if (typeof a === 'number' && b instanceof GraphValue) return [g.scalar(a, b.type), b];
  return refuse('a binary op of two numbers');
}

/** The one tensor argument of a float op (the engine's unary ops take float32 or float64 only; graphs take float32). */
function floatArg(x: unknown, op: string): GraphValue {
  if (!(x instanceof GraphValue)) return refuse(`${op} of something else than a tensor`);
  if (x.type !== 'float32') return refuse(`${op} of a ${x.type} tensor: the engine's op takes floats, graphs compute in float32`);
  return x;
}

/** A unary op written with the nodes `body` adds; the result keeps x's shape and type. */
function unary(op: string, body: (g: GraphBuilder, x: GraphValue) => GraphValue) {
  return (g: GraphBuilder, x: unknown): GraphValue => body(g, floatArg(x, op));
}

/** One ONNX op of one input. */
const single = (onnx: string) => (g: GraphBuilder, x: GraphValue) => g.node(onnx, [x]);

/**
 * A copy of x. Ops that give back their input (clone, detach, an identity cast or dropout)
 * still add a node: lowerStep declares as graph inputs only the values that nodes read, so a
 * step's output that is its input unchanged would name a value the graph does not have.
 */
const identity = (g: GraphBuilder, x: GraphValue): GraphValue => g.node('Identity', [x]);

const mulOf = (g: GraphBuilder, a: GraphValue, b: GraphValue) => g.node('Mul', [a, b], { shape: broadcast(a.shape, b.shape), type: a.type });
const addOf = (g: GraphBuilder, a: GraphValue, b: GraphValue) => g.node('Add', [a, b], { shape: broadcast(a.shape, b.shape), type: a.type });

const SQRT_2_OVER_PI = Math.sqrt(2 / Math.PI);
const GELU_C = 0.044715;

/**
 * GPT-2's gelu_new, as the engine's gelu: 0.5 x (1 + tanh(u)), u = √(2/π) (x + 0.044715 x³),
 * written as x · sigmoid(2u) (the same function), which keeps its precision where 1 + tanh(u)
 * would cancel (large negative x).
 */
function gelu(g: GraphBuilder, x: GraphValue): GraphValue {
  const cube = mulOf(g, mulOf(g, x, x), x);
  const twiceU = mulOf(g, addOf(g, x, mulOf(g, cube, g.scalar(GELU_C))), g.scalar(2 * SQRT_2_OVER_PI));
  return mulOf(g, x, g.node('Sigmoid', [twiceU]));
}

/** The exact GELU (geluErf): x/2 · (1 + erf(x/√2)). */
function geluErf(g: GraphBuilder, x: GraphValue): GraphValue {
  const erf = g.node('Erf', [mulOf(g, x, g.scalar(Math.SQRT1_2))]);
  return mulOf(g, mulOf(g, x, g.scalar(0.5)), addOf(g, erf, g.scalar(1)));
}

/**
 * x ** p. A number exponent of 1 to 4 is written as products (exact for negative bases, and
 * more precise than a GPU's pow, which is exp2(p · log2 |x|)); other exponents, and tensor
 * exponents (broadcast, same type as x), are ONNX Pow, which gives a negative base's integer
 * powers their sign as the js kernel's `**` does.
 */
function pow(g: GraphBuilder, xArg: unknown, p: unknown): GraphValue {
  const x = floatArg(xArg, 'pow');
  if (p instanceof GraphValue) {
    if (p.type !== x.type) return refuse(`pow of ${x.type} by ${p.type}`);
    return g.node('Pow', [x, p], { shape: broadcast(x.shape, p.shape), type: x.type });
  }
  if (typeof p !== 'number') return refuse('pow by something else than a number or a tensor');
  if (p === 1) return identity(g, x);
  if (p === 2) return mulOf(g, x, x);
  if (p === 3) return mulOf(g, mulOf(g, x, x), x);
  if (p === 4) {
    const square = mulOf(g, x, x);
    return mulOf(g, square, square);
  }
  return g.node('Pow', [x, g.scalar(p)]);
}

/** Where `mask` (broadcast to x) is non-zero, `value`; elsewhere x. */
function maskedFill(g: GraphBuilder, x: unknown, mask: unknown, value: unknown): GraphValue {
  if (!(x instanceof GraphValue) || !(mask instanceof GraphValue)) return refuse('maskedFill of something else than tensors');
  if (typeof value !== 'number') return refuse('maskedFill by something else than a number');
  if (x.type === 'float64' || mask.type === 'float64') return refuse('maskedFill of float64 values: graphs compute in float32');
  const shape = broadcast(x.shape, mask.shape);
  if (shape.length !== x.rank || shape.some((d, i) => d !== x.shape[i])) return refuse('maskedFill: the mask does not broadcast to x');
  const zero = mask.type === 'bool' ? g.constant(Uint8Array.of(0), [], 'bool') : g.scalar(0, mask.type);
  const keep = g.node('Equal', [mask, zero], { shape: mask.shape, type: 'bool' });
  return g.node('Where', [keep, x, g.scalar(value, x.type)], { shape: x.shape, type: x.type });
}

/** The dtype conversion of Tensor.to: float to int32 truncates toward zero, as Cast does. */
function cast(g: GraphBuilder, x: unknown, dtype: unknown): GraphValue {
  if (!(x instanceof GraphValue)) return refuse('cast of something else than a tensor');
  if (dtype !== 'float32' && dtype !== 'int32') return refuse(`cast to ${String(dtype)}: graphs compute in float32 and int32`);
  return x.type === dtype ? identity(g, x) : g.cast(x, dtype as ValueType);
}

/** clone and detach: the same values (a graph has no gradients and no shared storage). */
function same(op: string) {
  return (g: GraphBuilder, x: unknown): GraphValue => (x instanceof GraphValue ? identity(g, x) : refuse(`${op} of something else than a tensor`));
}

/**
 * Dropout only where it is the identity (p = 0, or not training): otherwise its mask is drawn
 * from the engine's generator, whose draws a graph cannot hold.
 */
function dropout(g: GraphBuilder, x: unknown, p: unknown, _generator: unknown, training: unknown = true): GraphValue {
  if (!(x instanceof GraphValue)) return refuse('dropout of something else than a tensor');
  if (typeof p !== 'number' || p < 0 || p >= 1) return refuse(`dropout probability ${String(p)} is not in [0, 1)`);
  if (training !== false && p !== 0) return refuse('dropout draws its mask from the engine\'s generator, which a graph does not hold');
  return identity(g, x);
}

export const ELEMENTWISE: LoweringTable = {
  add: binary('Add'),
  sub: binary('Sub'),
  mul: binary('Mul'),
  div: binary('Div'),
  neg: unary('neg', single('Neg')),
  exp: unary('exp', single('Exp')),
  log: unary('log', single('Log')),
  sqrt: unary('sqrt', single('Sqrt')),
  rsqrt: unary('rsqrt', (g, x) => g.node('Reciprocal', [g.node('Sqrt', [x])])),
  tanh: unary('tanh', single('Tanh')),
  sigmoid: unary('sigmoid', single('Sigmoid')),
  silu: unary('silu', (g, x) => mulOf(g, x, g.node('Sigmoid', [x]))),
  gelu: unary('gelu', gelu),
  geluErf: unary('geluErf', geluErf),
  relu: unary('relu', single('Relu')),
  pow,
  maskedFill,
  cast,
  clone: same('clone'),
  detach: same('detach'),
  dropout,
};
