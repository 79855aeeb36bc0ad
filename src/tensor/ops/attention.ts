import { ShapeMismatchError } from '../../errors.ts';
import { Tensor } from '../tensor.ts';
import { maskedFill, mul } from './elementwise.ts';
import { matmul } from './matmul.ts';
import { transpose } from './shape.ts';
import { softmax } from './softmax.ts';

export interface AttentionOptions {
  /** Each query attends only to keys at or before its own position. */
  causal?: boolean;
  /** int32, broadcastable to [B, H, Tq, Tk]: non-zero where a query may attend a key. */
  mask?: Tensor | null;
  /** Defaults to 1/sqrt(head dim). */
  scale?: number;
}

/**
 * Scaled dot-product attention, composed from matmul, a masked fill and softmax.
 * q is [B, H, Tq, D]; k and v are [B, H, Tk, D] and may include past keys/values
 * before the new ones (Tk ≥ Tq): the causal mask is then offset by Tk − Tq, so the
 * query at position i of the new tokens sees keys 0 .. (Tk − Tq + i).
 */
export function scaledDotProductAttention(
  q: Tensor,
  k: Tensor,
  v: Tensor,
  options: AttentionOptions = {},
): Tensor {
  if (q.ndim !== 4 || k.ndim !== 4 || v.ndim !== 4) {
    throw new ShapeMismatchError('attention expects q, k, v of rank 4: [batch, heads, time, head dim]');
  }
  const tq = q.shape[2];
  const tk = k.shape[2];
  const scale = options.scale ?? 1 / Math.sqrt(q.shape[3]);
  let scores = mul(matmul(q, transpose(k, -2, -1)), scale); // [B, H, Tq, Tk]
  let blocked: Tensor | null = null;
  if (options.causal) {
    const offset = tk - tq;
    const m = new Int32Array(tq * tk);
    for (let i = 0; i < tq; i++) for (let j = i + offset + 1; j < tk; j++) m[i * tk + j] = 1;
    blocked = new Tensor(m, [tq, tk]);
  }
  if (options.mask) {
    const user = options.mask;
    const inv = new Int32Array(user.size);
    for (let i = 0; i < inv.length; i++) inv[i] = user.data[i] === 0 ? 1 : 0;
    const userBlocked = new Tensor(inv, user.shape);
    scores = maskedFill(scores, userBlocked, Number.NEGATIVE_INFINITY);
  }
  if (blocked) scores = maskedFill(scores, blocked, Number.NEGATIVE_INFINITY);
  const p = softmax(scores, -1);
  return matmul(p, v); // [B, H, Tq, Dv]
}
