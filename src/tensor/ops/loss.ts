import { DTypeError, InvalidArgumentError, ShapeMismatchError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { getBackend } from '../backends/select.ts';
import { allocate, assertFloat } from '../dtype.ts';
import { releaseFloat32 } from '../pool.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';

export interface CrossEntropyOptions {
  /** Targets equal to this are skipped (default −100, as PyTorch). */
  ignoreIndex?: number;
  /** 'mean' over non-ignored targets (default), 'sum', or 'none' (per position). */
  reduction?: 'mean' | 'sum' | 'none';
  /**
   * With 'mean': divide the sum by this instead of the number of non-ignored targets (a
   * micro-batch's share of a whole batch's mean: the batch's target count).
   */
  divisor?: number;
}

/**
 * Cross-entropy of logits [..., C] against int32 class targets [...], fused with
 * log-softmax. The gradient is (softmax − one-hot) scaled by the reduction.
 * @example
 * const loss = crossEntropy(logits, targets)   // logits [B, T, V], targets [B, T]
 */
export function crossEntropy(logits: Tensor, targets: Tensor, options: CrossEntropyOptions = {}): Tensor {
  if (hooked) return hook('crossEntropy', crossEntropy, [logits, targets, options]);
  assertFloat(logits.dtype, 'crossEntropy');
  if (targets.dtype !== 'int32')
    throw new DTypeError(`crossEntropy targets must be int32, got ${targets.dtype}`);
  const c = logits.shape[logits.ndim - 1];
  const rows = logits.size / c;
  if (targets.size !== rows) {
    throw new ShapeMismatchError(
      `crossEntropy: logits [${logits.shape}] and targets [${targets.shape}] do not match`,
    );
  }
  const ignore = options.ignoreIndex ?? -100;
  const reduction = options.reduction ?? 'mean';
  if (options.divisor !== undefined && !(options.divisor > 0)) throw new InvalidArgumentError(`crossEntropy divisor must be > 0, got ${options.divisor}`);
  const x = logits.data;
  const t = targets.data;
  for (let r = 0; r < rows; r++) {
    if (t[r] !== ignore && (t[r] < 0 || t[r] >= c)) throw new ShapeMismatchError(`target ${t[r]} is outside [0, ${c})`);
  }
  // exp(x − rowmax) goes to the backend (vectorised where it can be); it is computed again
  // in the backward pass instead of being kept, so both passes use pooled temporaries only.
  const maxes = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    const base = r * c;
    let mx = Number.NEGATIVE_INFINITY;
    for (let j = 0; j < c; j++) mx = Math.max(mx, x[base + j]);
    maxes[r] = mx;
  }
  const e = shiftedExp(x, maxes, c);
  const sums = new Float64Array(rows);
  const losses = new Float64Array(rows);
  let count = 0;
  for (let r = 0; r < rows; r++) {
    const base = r * c;
    let total = 0;
    for (let j = 0; j < c; j++) total += e[base + j];
    sums[r] = total;
    if (t[r] === ignore) continue;
    losses[r] = Math.log(total) - (x[base + t[r]] - maxes[r]);
    count++;
  }
  if (e instanceof Float32Array) releaseFloat32(e);
  const divisor = options.divisor ?? count;
  let out: Tensor;
  if (reduction === 'none') {
    const values = allocate(logits.dtype, rows);
    values.set(losses);
    out = new Tensor(values, targets.shape);
  } else {
    let total = 0;
    for (let r = 0; r < rows; r++) total += losses[r];
    const value = reduction === 'mean' ? (divisor > 0 ? total / divisor : Number.NaN) : total;
    out = new Tensor(allocate(logits.dtype, 1).fill(value), []);
  }
  return record(out, 'crossEntropy', [logits], (g) => {
    const gx = shiftedExp(x, maxes, c);
    for (let r = 0; r < rows; r++) {
      if (t[r] === ignore) gx.fill(0, r * c, (r + 1) * c);
    }
    for (let r = 0; r < rows; r++) {
      if (t[r] === ignore) continue;
      const scale = reduction === 'none' ? g.data[r] : reduction === 'mean' ? g.data[0] / divisor : g.data[0];
      const base = r * c;
      const k = scale / sums[r];
      for (let j = 0; j < c; j++) gx[base + j] *= k;
      gx[base + t[r]] -= scale;
    }
    return [new Tensor(gx, logits.shape)];
  });
}

/** exp(x − rowmax) for every row of [rows, c], through the backend's exp when it has one. */
function shiftedExp(x: ArrayLike<number> & { length: number }, maxes: Float64Array, c: number): Float32Array | Float64Array {
  const like = x instanceof Float64Array ? 'float64' : 'float32';
  const shifted = allocate(like, x.length) as Float32Array | Float64Array;
  for (let r = 0; r < maxes.length; r++) {
    const base = r * c;
    const mx = maxes[r];
    for (let j = 0; j < c; j++) shifted[base + j] = x[base + j] - mx;
  }
  const e = allocate(like, x.length) as Float32Array | Float64Array;
  if (!getBackend().unary?.('exp', shifted, e)) for (let i = 0; i < e.length; i++) e[i] = Math.exp(shifted[i]);
  if (shifted instanceof Float32Array) releaseFloat32(shifted);
  return e;
}
