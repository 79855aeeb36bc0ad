import { DTypeError, InvalidArgumentError, ShapeMismatchError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { allocate } from '../dtype.ts';
import { stridedCopy } from '../kernels/strided.ts';
import {
  broadcastShapes,
  broadcastStrides,
  normalizeDim,
  resolveShape,
  sizeOf,
  stridesOf,
} from '../shape.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';
import { sumTo } from './reduce.ts';

/** Shape ops. Reshapes share the buffer; everything that moves data copies. */

export function reshape(x: Tensor, shape: readonly number[]): Tensor {
  if (hooked) return hook('reshape', reshape, [x, shape]);
  const target = resolveShape(shape, x.size);
  const out = new Tensor(x.data, target);
  return record(out, 'reshape', [x], (g) => [new Tensor(g.data, x.shape)]);
}

export function flatten(x: Tensor, startDim = 0, endDim = -1): Tensor {
  if (hooked) return hook('flatten', flatten, [x, startDim, endDim]);
  if (x.ndim === 0) return reshape(x, [1]);
  const s = normalizeDim(startDim, x.ndim);
  const e = normalizeDim(endDim, x.ndim);
  return reshape(x, [...x.shape.slice(0, s), sizeOf(x.shape.slice(s, e + 1)), ...x.shape.slice(e + 1)]);
}

export function unsqueeze(x: Tensor, dim: number): Tensor {
  if (hooked) return hook('unsqueeze', unsqueeze, [x, dim]);
  const d = normalizeDim(dim, x.ndim + 1);
  return reshape(x, [...x.shape.slice(0, d), 1, ...x.shape.slice(d)]);
}

export function squeeze(x: Tensor, dim?: number): Tensor {
  if (hooked) return hook('squeeze', squeeze, [x, dim]);
  if (dim === undefined)
    return reshape(
      x,
      x.shape.filter((d) => d !== 1),
    );
  const d = normalizeDim(dim, x.ndim);
  if (x.shape[d] !== 1) return x;
  return reshape(x, [...x.shape.slice(0, d), ...x.shape.slice(d + 1)]);
}

export function clone(x: Tensor): Tensor {
  if (hooked) return hook('clone', clone, [x]);
  return record(new Tensor(x.data.slice(), x.shape), 'clone', [x], (g) => [g]);
}

export function permute(x: Tensor, dims: number[]): Tensor {
  if (hooked) return hook('permute', permute, [x, dims]);
  if (dims.length !== x.ndim)
    throw new InvalidArgumentError(`permute needs ${x.ndim} dims, got ${dims.length}`);
  const perm = dims.map((d) => normalizeDim(d, x.ndim));
  if (new Set(perm).size !== perm.length) throw new InvalidArgumentError(`permute dims [${dims}] repeat`);
  const inStrides = stridesOf(x.shape);
  const shape = perm.map((p) => x.shape[p]);
  const out = allocate(x.dtype, x.size);
  stridedCopy(
    x.data,
    perm.map((p) => inStrides[p]),
    shape,
    out,
  );
  const inverse = new Array<number>(perm.length);
  perm.forEach((p, i) => {
    inverse[p] = i;
  });
  return record(new Tensor(out, shape), 'permute', [x], (g) => [permute(g, inverse)]);
}

export function transpose(x: Tensor, dim0: number, dim1: number): Tensor {
  if (hooked) return hook('transpose', transpose, [x, dim0, dim1]);
  const perm = x.shape.map((_, i) => i);
  const a = normalizeDim(dim0, x.ndim);
  const b = normalizeDim(dim1, x.ndim);
  [perm[a], perm[b]] = [perm[b], perm[a]];
  return permute(x, perm);
}

/** Copies rows [start, start+length) of one dim into `out` at `outOffset` of the same dim. */
function copyBlock(
  src: Tensor,
  dim: number,
  start: number,
  length: number,
  out: Float32Array | Float64Array | Int32Array,
  outDimSize: number,
  outOffset: number,
): void {
  const outer = sizeOf(src.shape.slice(0, dim));
  const inner = sizeOf(src.shape.slice(dim + 1));
  const n = src.shape[dim];
  for (let o = 0; o < outer; o++) {
    const from = (o * n + start) * inner;
    out.set(src.data.subarray(from, from + length * inner), (o * outDimSize + outOffset) * inner);
  }
}

/** Elements [start, start+length) of one dim (a copy). */
export function narrow(x: Tensor, dim: number, start: number, length: number): Tensor {
  if (hooked) return hook('narrow', narrow, [x, dim, start, length]);
  const d = normalizeDim(dim, x.ndim);
  const s = start < 0 ? start + x.shape[d] : start;
  if (s < 0 || length < 0 || s + length > x.shape[d]) {
    throw new InvalidArgumentError(
      `narrow(${dim}, ${start}, ${length}) is outside a dim of size ${x.shape[d]}`,
    );
  }
  const shape = [...x.shape];
  shape[d] = length;
  const out = allocate(x.dtype, sizeOf(shape));
  const view = new Tensor(out, shape);
  copyBlock(x, d, s, length, out, length, 0);
  return record(view, 'narrow', [x], (g) => {
    const gx = allocate(x.dtype, x.size);
    copyBlock(g, d, 0, length, gx, x.shape[d], s);
    return [new Tensor(gx, x.shape)];
  });
}

/** Joins tensors along an existing dim. */
export function cat(tensors: Tensor[], dim = 0): Tensor {
  if (hooked) return hook('cat', cat, [tensors, dim]);
  if (tensors.length === 0) throw new InvalidArgumentError('cat needs at least one tensor');
  const first = tensors[0];
  const d = normalizeDim(dim, first.ndim);
  for (const t of tensors) {
    if (t.dtype !== first.dtype) throw new DTypeError('cat of tensors with different dtypes');
    if (t.ndim !== first.ndim || t.shape.some((s, i) => i !== d && s !== first.shape[i])) {
      throw new ShapeMismatchError(`cat along dim ${dim}: shapes [${first.shape}] and [${t.shape}] differ`);
    }
  }
  const shape = [...first.shape];
  shape[d] = tensors.reduce((n, t) => n + t.shape[d], 0);
  const out = allocate(first.dtype, sizeOf(shape));
  let offset = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    offsets.push(offset);
    copyBlock(t, d, 0, t.shape[d], out, shape[d], offset);
    offset += t.shape[d];
  }
  return record(new Tensor(out, shape), 'cat', tensors, (g) =>
    tensors.map((t, i) => (t.requiresGrad ? narrow(g, d, offsets[i], t.shape[d]) : null)),
  );
}

/** Splits into chunks of `size` (the last may be smaller) or into the given sizes. */
export function split(x: Tensor, sizeOrSizes: number | number[], dim = 0): Tensor[] {
  if (hooked) return hook('split', split, [x, sizeOrSizes, dim]);
  const d = normalizeDim(dim, x.ndim);
  const n = x.shape[d];
  let sizes: number[];
  if (typeof sizeOrSizes === 'number') {
    if (sizeOrSizes <= 0) throw new InvalidArgumentError('split size must be positive');
    sizes = [];
    for (let s = 0; s < n; s += sizeOrSizes) sizes.push(Math.min(sizeOrSizes, n - s));
  } else {
    sizes = sizeOrSizes;
    if (sizes.reduce((a, b) => a + b, 0) !== n) {
      throw new ShapeMismatchError(`split sizes [${sizes}] do not add up to ${n}`);
    }
  }
  let start = 0;
  return sizes.map((len) => {
    const part = narrow(x, d, start, len);
    start += len;
    return part;
  });
}

/** Broadcasts to a larger shape (a copy); the gradient sums back. -1 keeps a dim. */
export function expand(x: Tensor, shape: readonly number[]): Tensor {
  if (hooked) return hook('expand', expand, [x, shape]);
  const offset = shape.length - x.ndim;
  const target = shape.map((s, i) => (s === -1 ? x.shape[i - offset] : s));
  const full = broadcastShapes(x.shape, target);
  if (full.some((s, i) => s !== target[i])) {
    throw new ShapeMismatchError(`cannot expand [${x.shape}] to [${shape}]`);
  }
  const out = allocate(x.dtype, sizeOf(target));
  stridedCopy(x.data, broadcastStrides(x.shape, target), target, out);
  return record(new Tensor(out, target), 'expand', [x], (g) => [sumTo(g, x.shape)]);
}

function checkIndex(index: Tensor, limit: number, op: string): void {
  if (index.dtype !== 'int32') throw new DTypeError(`${op} needs an int32 index, got ${index.dtype}`);
  for (const v of index.data) {
    if (v < 0 || v >= limit)
      throw new InvalidArgumentError(`${op}: index ${v} is out of range [0, ${limit})`);
  }
}

/** Picks whole slices along `dim` by a 1-D int32 index. */
export function indexSelect(x: Tensor, dim: number, index: Tensor): Tensor {
  if (hooked) return hook('indexSelect', indexSelect, [x, dim, index]);
  const d = normalizeDim(dim, x.ndim);
  if (index.ndim !== 1) throw new ShapeMismatchError('indexSelect needs a 1-D index');
  checkIndex(index, x.shape[d], 'indexSelect');
  const outer = sizeOf(x.shape.slice(0, d));
  const inner = sizeOf(x.shape.slice(d + 1));
  const n = x.shape[d];
  const k = index.size;
  const shape = [...x.shape];
  shape[d] = k;
  const out = allocate(x.dtype, sizeOf(shape));
  for (let o = 0; o < outer; o++) {
    for (let j = 0; j < k; j++) {
      const from = (o * n + index.data[j]) * inner;
      out.set(x.data.subarray(from, from + inner), (o * k + j) * inner);
    }
  }
  return record(new Tensor(out, shape), 'indexSelect', [x], (g) => {
    const gx = allocate(x.dtype, x.size);
    for (let o = 0; o < outer; o++) {
      for (let j = 0; j < k; j++) {
        const to = (o * n + index.data[j]) * inner;
        const from = (o * k + j) * inner;
        for (let i = 0; i < inner; i++) gx[to + i] += g.data[from + i];
      }
    }
    return [new Tensor(gx, x.shape)];
  });
}

/** out[..., j, ...] = x[..., index[..., j, ...], ...] along `dim` (index has x's rank). */
export function gather(x: Tensor, dim: number, index: Tensor): Tensor {
  if (hooked) return hook('gather', gather, [x, dim, index]);
  const d = normalizeDim(dim, x.ndim);
  if (index.ndim !== x.ndim) throw new ShapeMismatchError('gather needs an index of the same rank');
  checkIndex(index, x.shape[d], 'gather');
  const xStrides = stridesOf(x.shape);
  const idxShape = index.shape;
  const out = allocate(x.dtype, index.size);
  const srcOffsets = new Int32Array(index.size);
  const counter = new Array<number>(idxShape.length).fill(0);
  for (let p = 0; p < index.size; p++) {
    let off = 0;
    for (let a = 0; a < idxShape.length; a++) off += (a === d ? index.data[p] : counter[a]) * xStrides[a];
    srcOffsets[p] = off;
    out[p] = x.data[off];
    for (let a = idxShape.length - 1; a >= 0; a--) {
      if (++counter[a] < idxShape[a]) break;
      counter[a] = 0;
    }
  }
  return record(new Tensor(out, index.shape), 'gather', [x], (g) => {
    const gx = allocate(x.dtype, x.size);
    for (let p = 0; p < index.size; p++) gx[srcOffsets[p]] += g.data[p];
    return [new Tensor(gx, x.shape)];
  });
}
