import { DTypeError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { getBackend } from '../backends/select.ts';
import { allocate, assertFloat, type TypedArray } from '../dtype.ts';
import { stridedBinary } from '../kernels/strided.ts';
import { broadcastShapes, broadcastStrides, sameShape, sizeOf } from '../shape.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';
import { sumTo } from './reduce.ts';

/**
 * Elementwise ops. Unary ops are one table of (forward, derivative) pairs; binary ops
 * broadcast as NumPy does and reduce their gradients back to each input's shape.
 */

const SQRT_2_OVER_PI = Math.sqrt(2 / Math.PI);
const GELU_C = 0.044715;

type Buf = Float32Array | Float64Array;

/**
 * One entry per unary op: a forward loop y = f(x) and a backward loop
 * gx = g · f'(x) (given x and the stored y). Loops are written out per op so that the
 * engine compiles each to straight-line code instead of a call per element.
 */
interface UnaryDef {
  forward(x: Buf, y: Buf): void;
  backward(x: Buf, y: Buf, g: Buf, gx: Buf): void;
}

export const unaryOps = {
  neg: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) y[i] = -x[i];
    },
    backward: (_x, _y, g, gx) => {
      for (let i = 0; i < g.length; i++) gx[i] = -g[i];
    },
  },
  exp: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) y[i] = Math.exp(x[i]);
    },
    backward: (_x, y, g, gx) => {
      for (let i = 0; i < g.length; i++) gx[i] = g[i] * y[i];
    },
  },
  log: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) y[i] = Math.log(x[i]);
    },
    backward: (x, _y, g, gx) => {
      for (let i = 0; i < g.length; i++) gx[i] = g[i] / x[i];
    },
  },
  sqrt: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) y[i] = Math.sqrt(x[i]);
    },
    backward: (x, _y, g, gx) => {
      for (let i = 0; i < g.length; i++) gx[i] = (0.5 * g[i]) / Math.sqrt(x[i]);
    },
  },
  rsqrt: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) y[i] = 1 / Math.sqrt(x[i]);
    },
    backward: (x, _y, g, gx) => {
      for (let i = 0; i < g.length; i++) gx[i] = (-0.5 * g[i]) / (x[i] * Math.sqrt(x[i]));
    },
  },
  tanh: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) y[i] = Math.tanh(x[i]);
    },
    backward: (_x, y, g, gx) => {
      for (let i = 0; i < g.length; i++) gx[i] = g[i] * (1 - y[i] * y[i]);
    },
  },
  sigmoid: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) y[i] = 1 / (1 + Math.exp(-x[i]));
    },
    backward: (_x, y, g, gx) => {
      for (let i = 0; i < g.length; i++) gx[i] = g[i] * y[i] * (1 - y[i]);
    },
  },
  silu: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) y[i] = x[i] / (1 + Math.exp(-x[i]));
    },
    backward: (x, _y, g, gx) => {
      for (let i = 0; i < g.length; i++) {
        const v = x[i];
        const s = 1 / (1 + Math.exp(-v));
        gx[i] = g[i] * s * (1 + v * (1 - s));
      }
    },
  },
  // GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  gelu: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) {
        const v = x[i];
        y[i] = 0.5 * v * (1 + Math.tanh(SQRT_2_OVER_PI * (v + GELU_C * v * v * v)));
      }
    },
    backward: (x, _y, g, gx) => {
      for (let i = 0; i < g.length; i++) {
        const v = x[i];
        const t = Math.tanh(SQRT_2_OVER_PI * (v + GELU_C * v * v * v));
        gx[i] = g[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * GELU_C * v * v));
      }
    },
  },
  relu: {
    forward: (x, y) => {
      for (let i = 0; i < x.length; i++) y[i] = Math.max(x[i], 0);
    },
    backward: (x, _y, g, gx) => {
      for (let i = 0; i < g.length; i++) gx[i] = x[i] > 0 ? g[i] : 0;
    },
  },
} satisfies Record<string, UnaryDef>;

export type UnaryOp = keyof typeof unaryOps;

function unary(op: UnaryOp, x: Tensor): Tensor {
  assertFloat(x.dtype, op);
  const def: UnaryDef = unaryOps[op];
  const src = x.data as Buf;
  const out = allocate(x.dtype, src.length) as Buf;
  const backend = getBackend();
  if (!backend.unary?.(op, src, out)) def.forward(src, out);
  const y = new Tensor(out, x.shape);
  return record(y, op, [x], (g) => {
    const gx = allocate(x.dtype, src.length) as Buf;
    if (!backend.unaryBackward?.(op, src, g.data as Buf, gx)) def.backward(src, out, g.data as Buf, gx);
    return [new Tensor(gx, x.shape)];
  });
}

export const neg = (x: Tensor): Tensor => (hooked ? hook('neg', neg, [x]) : unary('neg', x));
export const exp = (x: Tensor): Tensor => (hooked ? hook('exp', exp, [x]) : unary('exp', x));
export const log = (x: Tensor): Tensor => (hooked ? hook('log', log, [x]) : unary('log', x));
export const sqrt = (x: Tensor): Tensor => (hooked ? hook('sqrt', sqrt, [x]) : unary('sqrt', x));
export const rsqrt = (x: Tensor): Tensor => (hooked ? hook('rsqrt', rsqrt, [x]) : unary('rsqrt', x));
export const tanh = (x: Tensor): Tensor => (hooked ? hook('tanh', tanh, [x]) : unary('tanh', x));
export const sigmoid = (x: Tensor): Tensor => (hooked ? hook('sigmoid', sigmoid, [x]) : unary('sigmoid', x));
export const silu = (x: Tensor): Tensor => (hooked ? hook('silu', silu, [x]) : unary('silu', x));
export const gelu = (x: Tensor): Tensor => (hooked ? hook('gelu', gelu, [x]) : unary('gelu', x));
export const relu = (x: Tensor): Tensor => (hooked ? hook('relu', relu, [x]) : unary('relu', x));

type BinaryOp = 'add' | 'sub' | 'mul' | 'div' | 'pow';

const binaryFns: Record<BinaryOp, (x: number, y: number) => number> = {
  add: (x, y) => x + y,
  sub: (x, y) => x - y,
  mul: (x, y) => x * y,
  div: (x, y) => x / y,
  pow: (x, y) => x ** y,
};

function asTensor(v: Tensor | number, like: Tensor): Tensor {
  if (typeof v !== 'number') return v;
  return new Tensor(allocate(like.dtype, 1).fill(v), []);
}

/** Runs a binary kernel with fast paths for equal shapes and a trailing broadcast (bias). */
function binaryKernel(op: BinaryOp, a: Tensor, b: Tensor, shape: number[]): TypedArray {
  const f = binaryFns[op];
  const out = allocate(a.dtype, sizeOf(shape));
  const ad = a.data;
  const bd = b.data;
  const n = out.length;
  if (sameShape(a.shape, b.shape)) {
    // add and mul written out (the residual stream and gated MLPs): a call per element costs more than the sum
    if (op === 'add') for (let i = 0; i < n; i++) out[i] = ad[i] + bd[i];
    else if (op === 'mul') for (let i = 0; i < n; i++) out[i] = ad[i] * bd[i];
    else for (let i = 0; i < n; i++) out[i] = f(ad[i], bd[i]);
  } else if (bd.length === 1) {
    const y = bd[0];
    if (ad.length === n) for (let i = 0; i < n; i++) out[i] = f(ad[i], y);
    else
      stridedBinary(
        ad,
        broadcastStrides(a.shape, shape),
        bd,
        broadcastStrides(b.shape, shape),
        shape,
        out,
        f,
      );
  } else if (ad.length === n && isTrailing(b.shape, shape)) {
    const m = bd.length;
    for (let i = 0; i < n; i += m) for (let j = 0; j < m; j++) out[i + j] = f(ad[i + j], bd[j]);
  } else {
    stridedBinary(ad, broadcastStrides(a.shape, shape), bd, broadcastStrides(b.shape, shape), shape, out, f);
  }
  return out;
}

/** True when `small` (after dropping leading 1s) equals the trailing dims of `big`. */
function isTrailing(small: readonly number[], big: readonly number[]): boolean {
  let s = 0;
  while (s < small.length && small[s] === 1) s++;
  const tail = small.slice(s);
  const offset = big.length - tail.length;
  return offset >= 0 && tail.every((d, i) => d === big[offset + i]);
}

function binary(op: BinaryOp, aIn: Tensor | number, bIn: Tensor | number): Tensor {
  const a = typeof aIn === 'number' ? asTensor(aIn, bIn as Tensor) : aIn;
  const b = asTensor(bIn, a);
  if (a.dtype !== b.dtype) throw new DTypeError(`${op} of ${a.dtype} and ${b.dtype}; convert one with .to()`);
  const shape = broadcastShapes(a.shape, b.shape);
  const out = new Tensor(binaryKernel(op, a, b, shape), shape);
  return record(out, op, [a, b], (g) => {
    switch (op) {
      case 'add':
        return [sumTo(g, a.shape), sumTo(g, b.shape)];
      case 'sub':
        return [sumTo(g, a.shape), b.requiresGrad ? sumTo(neg(g), b.shape) : null];
      case 'mul':
        return [
          a.requiresGrad ? sumTo(mul(g, b), a.shape) : null,
          b.requiresGrad ? sumTo(mul(g, a), b.shape) : null,
        ];
      case 'div':
        return [
          a.requiresGrad ? sumTo(div(g, b), a.shape) : null,
          b.requiresGrad ? sumTo(neg(div(mul(g, out), b)), b.shape) : null,
        ];
      case 'pow':
        return [
          a.requiresGrad ? sumTo(mul(g, mul(b, binary('pow', a, sub(b, 1)))), a.shape) : null,
          b.requiresGrad ? sumTo(mul(g, mul(out, log(a))), b.shape) : null,
        ];
    }
  });
}

export const add = (a: Tensor | number, b: Tensor | number): Tensor => (hooked ? hook('add', add, [a, b]) : binary('add', a, b));
export const sub = (a: Tensor | number, b: Tensor | number): Tensor => (hooked ? hook('sub', sub, [a, b]) : binary('sub', a, b));
export const mul = (a: Tensor | number, b: Tensor | number): Tensor => (hooked ? hook('mul', mul, [a, b]) : binary('mul', a, b));
export const div = (a: Tensor | number, b: Tensor | number): Tensor => (hooked ? hook('div', div, [a, b]) : binary('div', a, b));

/** x ** p: a number exponent (fast, one pass) or a tensor exponent (broadcast). */
export function pow(x: Tensor, p: number | Tensor): Tensor {
  if (hooked) return hook('pow', pow, [x, p]);
  if (typeof p !== 'number') return binary('pow', x, p);
  assertFloat(x.dtype, 'pow');
  const src = x.data;
  const out = allocate(x.dtype, src.length);
  for (let i = 0; i < src.length; i++) out[i] = src[i] ** p;
  return record(new Tensor(out, x.shape), 'pow', [x], (g) => {
    const gd = g.data;
    const gx = allocate(x.dtype, src.length);
    for (let i = 0; i < src.length; i++) gx[i] = gd[i] * p * src[i] ** (p - 1);
    return [new Tensor(gx, x.shape)];
  });
}

/** Where `mask` (int32, broadcast to x) is non-zero, `value`; elsewhere x. */
export function maskedFill(x: Tensor, mask: Tensor, value: number): Tensor {
  if (hooked) return hook('maskedFill', maskedFill, [x, mask, value]);
  const shape = broadcastShapes(x.shape, mask.shape);
  if (!sameShape(shape, x.shape)) throw new DTypeError('maskedFill: mask must broadcast to x');
  const m = allocate('int32', x.size);
  stridedBinary(
    mask.data,
    broadcastStrides(mask.shape, shape),
    m,
    broadcastStrides(shape, shape),
    shape,
    m,
    (v) => (v !== 0 ? 1 : 0),
  );
  const out = allocate(x.dtype, x.size);
  for (let i = 0; i < out.length; i++) out[i] = m[i] ? value : x.data[i];
  return record(new Tensor(out, x.shape), 'maskedFill', [x], (g) => {
    const gx = allocate(x.dtype, x.size);
    for (let i = 0; i < gx.length; i++) gx[i] = m[i] ? 0 : g.data[i];
    return [new Tensor(gx, x.shape)];
  });
}
