import { DTypeError, ShapeMismatchError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { allocate, assertFloat } from '../dtype.ts';
import { Tensor } from '../tensor.ts';

export interface CrossEntropyOptions {
  /** Targets equal to this are skipped (default −100, as PyTorch). */
  ignoreIndex?: number;
  /** 'mean' over non-ignored targets (default), 'sum', or 'none' (per position). */
  reduction?: 'mean' | 'sum' | 'none';
}

/**
 * Cross-entropy of logits [..., C] against int32 class targets [...], fused with
 * log-softmax. The gradient is (softmax − one-hot) scaled by the reduction.
 * @example
 * const loss = crossEntropy(logits, targets)   // logits [B, T, V], targets [B, T]
 */
export function crossEntropy(logits: Tensor, targets: Tensor, options: CrossEntropyOptions = {}): Tensor {
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
  const x = logits.data;
  const t = targets.data;
  const losses = new Float64Array(rows);
  const lse = new Float64Array(rows);
  let count = 0;
  for (let r = 0; r < rows; r++) {
    const target = t[r];
    if (target === ignore) continue;
    if (target < 0 || target >= c) throw new ShapeMismatchError(`target ${target} is outside [0, ${c})`);
    const base = r * c;
    let mx = Number.NEGATIVE_INFINITY;
    for (let j = 0; j < c; j++) mx = Math.max(mx, x[base + j]);
    let total = 0;
    for (let j = 0; j < c; j++) total += Math.exp(x[base + j] - mx);
    lse[r] = mx + Math.log(total);
    losses[r] = lse[r] - x[base + target];
    count++;
  }
  let out: Tensor;
  if (reduction === 'none') {
    out = new Tensor(
      allocate(logits.dtype, rows).map((_, r) => losses[r]),
      targets.shape,
    );
  } else {
    let s = 0;
    for (let r = 0; r < rows; r++) s += losses[r];
    const value = reduction === 'mean' ? (count > 0 ? s / count : Number.NaN) : s;
    out = new Tensor(allocate(logits.dtype, 1).fill(value), []);
  }
  return record(out, 'crossEntropy', [logits], (g) => {
    const gx = allocate(logits.dtype, logits.size);
    for (let r = 0; r < rows; r++) {
      if (t[r] === ignore) continue;
      const scale = reduction === 'none' ? g.data[r] : reduction === 'mean' ? g.data[0] / count : g.data[0];
      const base = r * c;
      for (let j = 0; j < c; j++) gx[base + j] = Math.exp(x[base + j] - lse[r]) * scale;
      gx[base + t[r]] -= scale;
    }
    return [new Tensor(gx, logits.shape)];
  });
}
