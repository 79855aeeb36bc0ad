import { record } from '../autograd.ts';
import { allocate, assertFloat } from '../dtype.ts';
import { stridedCopy, sumMiddle } from '../kernels/strided.ts';
import { broadcastStrides, normalizeDim, sameShape, sizeOf } from '../shape.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';

/** Reductions: sum, mean and max over dims (or all), with keepdim; argmax. */

function dimsOf(x: Tensor, dim: number | number[] | undefined): number[] {
  if (dim === undefined) return x.shape.map((_, i) => i);
  const list = Array.isArray(dim) ? dim : [dim];
  return [...new Set(list.map((d) => normalizeDim(d, x.ndim)))].sort((p, q) => p - q);
}

function reducedShape(shape: readonly number[], dims: number[], keepdim: boolean): number[] {
  const out: number[] = [];
  shape.forEach((d, i) => {
    if (!dims.includes(i)) out.push(d);
    else if (keepdim) out.push(1);
  });
  return out;
}

/** Views x as [outer, reduce, inner] around one dim. */
function around(shape: readonly number[], d: number): [number, number, number] {
  return [sizeOf(shape.slice(0, d)), shape[d], sizeOf(shape.slice(d + 1))];
}

/** Sum without autograd, one dim at a time from the last (a fixed order). */
function sumRaw(x: Tensor, dims: number[]): Tensor {
  let data = x.data;
  const shape = [...x.shape];
  if (dims.length === x.ndim && dims.length > 0) {
    let acc = 0;
    for (let i = 0; i < data.length; i++) acc += data[i];
    return new Tensor(allocate(x.dtype, 1).fill(acc), []);
  }
  for (let k = dims.length - 1; k >= 0; k--) {
    const d = dims[k];
    const [outer, reduce, inner] = around(shape, d);
    const out = allocate(x.dtype, outer * inner);
    sumMiddle(data, outer, reduce, inner, out);
    data = out;
    shape[d] = 1;
  }
  return new Tensor(data, shape);
}

function broadcastTo(g: Tensor, shape: readonly number[]): Tensor {
  if (sameShape(g.shape, shape)) return g;
  const out = allocate(g.dtype, sizeOf(shape));
  stridedCopy(g.data, broadcastStrides(g.shape, shape), shape, out);
  return new Tensor(out, shape);
}

export function sum(x: Tensor, dim?: number | number[], keepdim = false): Tensor {
  if (hooked) return hook('sum', sum, [x, dim, keepdim]);
  const dims = dimsOf(x, dim);
  const kept = sumRaw(x, dims);
  const outShape = reducedShape(x.shape, dims, keepdim);
  const out = new Tensor(kept.data, outShape);
  const keptShape = reducedShape(x.shape, dims, true);
  return record(out, 'sum', [x], (g) => [broadcastTo(g.reshape(keptShape), x.shape)]);
}

export function mean(x: Tensor, dim?: number | number[], keepdim = false): Tensor {
  if (hooked) return hook('mean', mean, [x, dim, keepdim]);
  assertFloat(x.dtype, 'mean');
  const dims = dimsOf(x, dim);
  const count = dims.reduce((n, d) => n * x.shape[d], 1);
  const s = sumRaw(x, dims);
  const data = s.data;
  for (let i = 0; i < data.length; i++) data[i] /= count;
  const out = new Tensor(data, reducedShape(x.shape, dims, keepdim));
  const keptShape = reducedShape(x.shape, dims, true);
  return record(out, 'mean', [x], (g) => {
    const b = broadcastTo(g.reshape(keptShape), x.shape);
    const gd = allocate(x.dtype, b.size);
    for (let i = 0; i < gd.length; i++) gd[i] = b.data[i] / count;
    return [new Tensor(gd, x.shape)];
  });
}

/** Reduces a broadcast gradient back to `shape` (sums leading and size-1 dims). */
export function sumTo(g: Tensor, shape: readonly number[]): Tensor {
  if (hooked) return hook('sumTo', sumTo, [g, shape]);
  if (sameShape(g.shape, shape)) return g;
  const lead = g.ndim - shape.length;
  const dims: number[] = [];
  for (let i = 0; i < g.ndim; i++) {
    if (i < lead || (shape[i - lead] === 1 && g.shape[i] !== 1)) dims.push(i);
  }
  return sumRaw(g, dims).reshape(shape);
}

/** Max values over one dim (or of all elements); the gradient flows to the first maximum. */
export function max(x: Tensor, dim?: number, keepdim = false): Tensor {
  if (hooked) return hook('max', max, [x, dim, keepdim]);
  const flat = dim === undefined;
  const d = flat ? 0 : normalizeDim(dim, x.ndim);
  const [outer, reduce, inner] = around(flat ? [x.size] : x.shape, d);
  const values = allocate(x.dtype, outer * inner);
  const where = new Int32Array(outer * inner);
  const data = x.data;
  for (let o = 0; o < outer; o++) {
    for (let i = 0; i < inner; i++) {
      let best = Number.NEGATIVE_INFINITY;
      let arg = 0;
      for (let r = 0; r < reduce; r++) {
        const v = data[(o * reduce + r) * inner + i];
        if (v > best || Number.isNaN(v)) {
          best = v;
          arg = r;
          if (Number.isNaN(v)) break;
        }
      }
      values[o * inner + i] = best;
      where[o * inner + i] = arg;
    }
  }
  const outShape = flat ? [] : reducedShape(x.shape, [d], keepdim);
  return record(new Tensor(values, outShape), 'max', [x], (g) => {
    const gx = allocate(x.dtype, x.size);
    for (let o = 0; o < outer; o++) {
      for (let i = 0; i < inner; i++)
        gx[(o * reduce + where[o * inner + i]) * inner + i] = g.data[o * inner + i];
    }
    return [new Tensor(gx, x.shape)];
  });
}

/** Index of the first maximum along a dim, as int32. */
export function argmax(x: Tensor, dim = -1, keepdim = false): Tensor {
  if (hooked) return hook('argmax', argmax, [x, dim, keepdim]);
  const d = normalizeDim(dim, x.ndim);
  const [outer, reduce, inner] = around(x.shape, d);
  const out = new Int32Array(outer * inner);
  for (let o = 0; o < outer; o++) {
    for (let i = 0; i < inner; i++) {
      let best = Number.NEGATIVE_INFINITY;
      let arg = 0;
      for (let r = 0; r < reduce; r++) {
        const v = x.data[(o * reduce + r) * inner + i];
        if (v > best) {
          best = v;
          arg = r;
        }
      }
      out[o * inner + i] = arg;
    }
  }
  return new Tensor(out, reducedShape(x.shape, [d], keepdim));
}
