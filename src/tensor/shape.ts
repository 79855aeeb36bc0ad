import { InvalidArgumentError, ShapeMismatchError } from '../errors.ts';

export type Shape = readonly number[];

export function sizeOf(shape: Shape): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** Row-major strides of a contiguous tensor. */
export function stridesOf(shape: Shape): number[] {
  const strides = new Array<number>(shape.length);
  let s = 1;
  for (let i = shape.length - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

/** Resolves a possibly negative dim against a rank. */
export function normalizeDim(dim: number, ndim: number): number {
  const d = dim < 0 ? dim + ndim : dim;
  if (!Number.isInteger(d) || d < 0 || d >= ndim) {
    throw new InvalidArgumentError(`dim ${dim} is out of range for a tensor of rank ${ndim}`);
  }
  return d;
}

export function sameShape(a: Shape, b: Shape): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/** NumPy broadcasting of two shapes. */
export function broadcastShapes(a: Shape, b: Shape): number[] {
  const n = Math.max(a.length, b.length);
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    const da = a[a.length - n + i] ?? 1;
    const db = b[b.length - n + i] ?? 1;
    if (da !== db && da !== 1 && db !== 1) {
      throw new ShapeMismatchError(`shapes [${a}] and [${b}] cannot be broadcast together`);
    }
    out[i] = da === 1 ? db : da;
  }
  return out;
}

/**
 * Strides for reading a tensor of `shape` as if it had `target` shape (broadcast):
 * broadcast dims get stride 0.
 */
export function broadcastStrides(shape: Shape, target: Shape): number[] {
  const own = stridesOf(shape);
  const out = new Array<number>(target.length).fill(0);
  const offset = target.length - shape.length;
  for (let i = 0; i < shape.length; i++) out[offset + i] = shape[i] === 1 ? 0 : own[i];
  return out;
}

/** Resolves one -1 in a reshape target and checks the element count. */
export function resolveShape(target: Shape, size: number): number[] {
  const out = [...target];
  const free = out.indexOf(-1);
  if (free !== out.lastIndexOf(-1)) throw new InvalidArgumentError('reshape accepts at most one -1');
  if (free >= 0) {
    const known = sizeOf(out.filter((_, i) => i !== free));
    if (known === 0 || size % known !== 0) {
      throw new ShapeMismatchError(`cannot reshape ${size} elements into [${target}]`);
    }
    out[free] = size / known;
  }
  if (out.some((d) => !Number.isInteger(d) || d < 0)) {
    throw new InvalidArgumentError(`invalid shape [${target}]`);
  }
  if (sizeOf(out) !== size) throw new ShapeMismatchError(`cannot reshape ${size} elements into [${target}]`);
  return out;
}
