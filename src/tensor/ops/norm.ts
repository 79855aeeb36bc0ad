import { ShapeMismatchError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { getBackend } from '../backends/select.ts';
import { allocate, assertFloat, type FloatArray } from '../dtype.ts';
import { layerNormBackwardRows, rmsNormBackwardRows } from '../kernels/rows.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';

/**
 * Layer norm and RMS norm over the last dim, fused, with their analytic VJPs.
 * layerNorm: y = (x − μ)/σ · w + b, σ = sqrt(var + eps) (biased variance, as PyTorch).
 * rmsNorm:   y = x / sqrt(mean(x²) + eps) · w (as transformers' RMSNorm of the decoder families).
 */

function checkAffine(x: Tensor, weight: Tensor | null | undefined, op: string): number {
  assertFloat(x.dtype, op);
  const n = x.shape[x.ndim - 1];
  if (weight && (weight.ndim !== 1 || weight.size !== n)) {
    throw new ShapeMismatchError(`${op}: weight [${weight.shape}] does not match the last dim ${n}`);
  }
  return n;
}

function fromDoubles(values: Float64Array, like: Tensor): Tensor {
  const out = allocate(like.dtype, values.length);
  out.set(values);
  return new Tensor(out, like.shape);
}

/** The backend's layer norm where it has one (float32 statistics), else null. */
function nativeLayerNorm(x: FloatArray, w: FloatArray | undefined, b: FloatArray | undefined, eps: number, n: number, y: FloatArray) {
  const backend = getBackend();
  if (backend.layerNorm === undefined) return null;
  const rows = x.length / n;
  const mean = new Float32Array(rows);
  const rstd = new Float32Array(rows);
  const ok = backend.layerNorm(x, w ?? new Float32Array(n).fill(1), b ?? new Float32Array(n), eps, y, mean, rstd);
  return ok ? { mean, rstd } : null;
}

export function layerNorm(x: Tensor, weight?: Tensor | null, bias?: Tensor | null, eps = 1e-5): Tensor {
  if (hooked) return hook('layerNorm', layerNorm, [x, weight, bias, eps]);
  const n = checkAffine(x, weight, 'layerNorm');
  const rows = x.size / n;
  const src = x.data;
  const out = allocate(x.dtype, x.size);
  const means = new Float64Array(rows);
  const rstd = new Float64Array(rows);
  const w = weight?.data;
  const b = bias?.data;
  const stats = nativeLayerNorm(src as FloatArray, w as FloatArray | undefined, b as FloatArray | undefined, eps, n, out as FloatArray);
  if (stats) {
    means.set(stats.mean);
    rstd.set(stats.rstd);
  }
  for (let r = 0; r < rows && !stats; r++) {
    const base = r * n;
    let mean = 0;
    for (let j = 0; j < n; j++) mean += src[base + j];
    mean /= n;
    let v = 0;
    for (let j = 0; j < n; j++) {
      const d = src[base + j] - mean;
      v += d * d;
    }
    const rs = 1 / Math.sqrt(v / n + eps);
    rstd[r] = rs;
    means[r] = mean;
    for (let j = 0; j < n; j++) out[base + j] = (src[base + j] - mean) * rs * (w ? w[j] : 1) + (b ? b[j] : 0);
  }
  const inputs = [x, ...(weight ? [weight] : []), ...(bias ? [bias] : [])];
  return record(new Tensor(out, x.shape), 'layerNorm', inputs, (g) => {
    const gd = g.data;
    const gx = allocate(x.dtype, x.size);
    const gw = new Float64Array(n);
    const gb = new Float64Array(n);
    layerNormBackwardRows(src, gd, w, means, rstd, gx as FloatArray, gw, gb, rows, n);
    const grads: (Tensor | null)[] = [new Tensor(gx, x.shape)];
    if (weight) grads.push(fromDoubles(gw, weight));
    if (bias) grads.push(fromDoubles(gb, bias));
    return grads;
  });
}

export function rmsNorm(x: Tensor, weight?: Tensor | null, eps = 1e-6): Tensor {
  if (hooked) return hook('rmsNorm', rmsNorm, [x, weight, eps]);
  const n = checkAffine(x, weight, 'rmsNorm');
  const rows = x.size / n;
  const src = x.data;
  const out = allocate(x.dtype, x.size);
  const rstd = new Float64Array(rows);
  const w = weight?.data;
  for (let r = 0; r < rows; r++) {
    const base = r * n;
    let ss = 0;
    for (let j = 0; j < n; j++) ss += src[base + j] * src[base + j];
    const rs = 1 / Math.sqrt(ss / n + eps);
    rstd[r] = rs;
    for (let j = 0; j < n; j++) out[base + j] = src[base + j] * rs * (w ? w[j] : 1);
  }
  const inputs = weight ? [x, weight] : [x];
  return record(new Tensor(out, x.shape), 'rmsNorm', inputs, (g) => {
    const gd = g.data;
    const gx = allocate(x.dtype, x.size);
    const gw = new Float64Array(n);
    rmsNormBackwardRows(src, gd, w, rstd, gx as FloatArray, gw, rows, n);
    const grads: (Tensor | null)[] = [new Tensor(gx, x.shape)];
    if (weight) grads.push(fromDoubles(gw, weight));
    return grads;
  });
}
