import { record } from '../autograd.ts';
import { allocate, assertFloat } from '../dtype.ts';
import { normalizeDim, sizeOf } from '../shape.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';

/**
 * Softmax and log-softmax along one dim, fused (max-subtracted, double accumulation).
 * VJPs: softmax  dx = y ⊙ (g − Σ g⊙y);  log-softmax  dx = g − softmax ⊙ Σ g.
 */

function layout(x: Tensor, dim: number): [number, number, number] {
  const d = normalizeDim(dim, x.ndim);
  return [sizeOf(x.shape.slice(0, d)), x.shape[d], sizeOf(x.shape.slice(d + 1))];
}

function softmaxForward(x: Tensor, dim: number, asLog: boolean): Float32Array | Float64Array {
  assertFloat(x.dtype, asLog ? 'logSoftmax' : 'softmax');
  const [outer, n, inner] = layout(x, dim);
  const src = x.data;
  const out = allocate(x.dtype, x.size) as Float32Array | Float64Array;
  for (let o = 0; o < outer; o++) {
    for (let i = 0; i < inner; i++) {
      const base = o * n * inner + i;
      let mx = Number.NEGATIVE_INFINITY;
      for (let j = 0; j < n; j++) mx = Math.max(mx, src[base + j * inner]);
      if (mx === Number.NEGATIVE_INFINITY) mx = 0;
      let total = 0;
      for (let j = 0; j < n; j++) total += Math.exp(src[base + j * inner] - mx);
      if (asLog) {
        const lse = mx + Math.log(total);
        for (let j = 0; j < n; j++) out[base + j * inner] = src[base + j * inner] - lse;
      } else {
        // A row masked everywhere (all -inf) attends to nothing: zeros, not NaN.
        const scale = total > 0 ? 1 / total : 0;
        for (let j = 0; j < n; j++) out[base + j * inner] = Math.exp(src[base + j * inner] - mx) * scale;
      }
    }
  }
  return out;
}

export function softmax(x: Tensor, dim = -1): Tensor {
  if (hooked) return hook('softmax', softmax, [x, dim]);
  const y = softmaxForward(x, dim, false);
  const [outer, n, inner] = layout(x, dim);
  return record(new Tensor(y, x.shape), 'softmax', [x], (g) => {
    const gx = allocate(x.dtype, x.size);
    for (let o = 0; o < outer; o++) {
      for (let i = 0; i < inner; i++) {
        const base = o * n * inner + i;
        let dot = 0;
        for (let j = 0; j < n; j++) dot += g.data[base + j * inner] * y[base + j * inner];
        for (let j = 0; j < n; j++) {
          const p = base + j * inner;
          gx[p] = y[p] * (g.data[p] - dot);
        }
      }
    }
    return [new Tensor(gx, x.shape)];
  });
}

export function logSoftmax(x: Tensor, dim = -1): Tensor {
  if (hooked) return hook('logSoftmax', logSoftmax, [x, dim]);
  const y = softmaxForward(x, dim, true);
  const [outer, n, inner] = layout(x, dim);
  return record(new Tensor(y, x.shape), 'logSoftmax', [x], (g) => {
    const gx = allocate(x.dtype, x.size);
    for (let o = 0; o < outer; o++) {
      for (let i = 0; i < inner; i++) {
        const base = o * n * inner + i;
        let total = 0;
        for (let j = 0; j < n; j++) total += g.data[base + j * inner];
        for (let j = 0; j < n; j++) {
          const p = base + j * inner;
          gx[p] = g.data[p] - Math.exp(y[p]) * total;
        }
      }
    }
    return [new Tensor(gx, x.shape)];
  });
}
