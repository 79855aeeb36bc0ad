import type { TypedArray } from '../dtype.ts';
import type { Shape } from '../shape.ts';

/**
 * Copies `src`, read through arbitrary strides (0 for broadcast dims), into the
 * contiguous `out` of `shape`. The innermost dim is a tight loop.
 */
export function stridedCopy(
  src: TypedArray,
  strides: readonly number[],
  shape: Shape,
  out: TypedArray,
): void {
  const rank = shape.length;
  if (rank === 0) {
    out[0] = src[0];
    return;
  }
  const last = shape[rank - 1];
  const lastStride = strides[rank - 1];
  const outer = out.length / Math.max(last, 1);
  const counter = new Array<number>(rank).fill(0);
  let srcOffset = 0;
  let o = 0;
  for (let row = 0; row < outer; row++) {
    for (let j = 0, s = srcOffset; j < last; j++, s += lastStride) out[o++] = src[s];
    for (let d = rank - 2; d >= 0; d--) {
      counter[d]++;
      srcOffset += strides[d];
      if (counter[d] < shape[d]) break;
      srcOffset -= strides[d] * shape[d];
      counter[d] = 0;
    }
  }
}

/**
 * out[i] = f(a[ia], b[ib]) over the broadcast `shape`, reading a and b through
 * their (broadcast) strides.
 */
export function stridedBinary(
  a: TypedArray,
  aStrides: readonly number[],
  b: TypedArray,
  bStrides: readonly number[],
  shape: Shape,
  out: TypedArray,
  f: (x: number, y: number) => number,
): void {
  const rank = shape.length;
  if (rank === 0) {
    out[0] = f(a[0], b[0]);
    return;
  }
  const last = shape[rank - 1];
  const as = aStrides[rank - 1];
  const bs = bStrides[rank - 1];
  const outer = out.length / Math.max(last, 1);
  const counter = new Array<number>(rank).fill(0);
  let ao = 0;
  let bo = 0;
  let o = 0;
  for (let row = 0; row < outer; row++) {
    for (let j = 0, ia = ao, ib = bo; j < last; j++, ia += as, ib += bs) out[o++] = f(a[ia], b[ib]);
    for (let d = rank - 2; d >= 0; d--) {
      counter[d]++;
      ao += aStrides[d];
      bo += bStrides[d];
      if (counter[d] < shape[d]) break;
      ao -= aStrides[d] * shape[d];
      bo -= bStrides[d] * shape[d];
      counter[d] = 0;
    }
  }
}

/**
 * Sums `src` viewed as [outer, reduce, inner] over the middle axis into `out`
 * ([outer, inner]), accumulating in double precision in a fixed order.
 */
export function sumMiddle(
  src: TypedArray,
  outer: number,
  reduce: number,
  inner: number,
  out: TypedArray,
): void {
  if (inner === 1) {
    for (let o = 0; o < outer; o++) {
      let acc = 0;
      const base = o * reduce;
      for (let r = 0; r < reduce; r++) acc += src[base + r];
      out[o] = acc;
    }
    return;
  }
  const acc = new Float64Array(inner);
  for (let o = 0; o < outer; o++) {
    acc.fill(0);
    for (let r = 0; r < reduce; r++) {
      const base = (o * reduce + r) * inner;
      for (let i = 0; i < inner; i++) acc[i] += src[base + i];
    }
    out.set(acc, o * inner);
  }
}
