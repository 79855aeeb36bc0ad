import { maskedSoftmax, matmul, scaledDotProductAttention, type Tensor, tensor } from '../tensor/index.ts';

/**
 * Causal self-attention with the options the families differ by: a sliding window, a scale
 * other than 1/√d, and soft-capped scores. Eager, as transformers' eager_attention_forward.
 */
export interface AttentionOptions {
  /**
   * Sliding window: a query sees itself and the `window − 1` keys before it (transformers'
   * `kv_idx > q_idx − sliding_window`, over the cache's indices).
   */
  window?: number;
  /** Multiplies the scores (1/√head dim by default). */
  scale?: number;
  /** Scores become cap · tanh(scores / cap) before the mask and the softmax. */
  softcap?: number;
}

/**
 * Which keys each query may see: the key mask (padding, int32 [B, Tk]) and the window, as an
 * int32 mask broadcastable to [B, H, Tq, Tk]; null when every key before a query may be seen.
 * The queries are the last Tq of the Tk positions.
 */
export function attentionMask(batch: number, tq: number, tk: number, keyMask: Tensor | null, window?: number): Tensor | null {
  if (window === undefined || tk <= window) return keyMask ? keyMask.reshape([batch, 1, 1, tk]) : null;
  const rows = keyMask ? batch : 1;
  const past = tk - tq;
  const data = new Int32Array(rows * tq * tk);
  for (let b = 0; b < rows; b++) {
    for (let i = 0; i < tq; i++) {
      const row = (b * tq + i) * tk;
      for (let j = Math.max(0, past + i - window + 1); j < tk; j++) data[row + j] = keyMask ? (keyMask.data[b * tk + j] !== 0 ? 1 : 0) : 1;
    }
  }
  return tensor(data, [rows, 1, tq, tk], 'int32');
}

/**
 * q [B, H, Tq, D] attends causally over k, v [B, H, Tk, D] (Tk ≥ Tq: the cached keys first, the
 * queries' own last): [B, H, Tq, D].
 */
export function causalAttention(q: Tensor, k: Tensor, v: Tensor, keyMask: Tensor | null, options: AttentionOptions = {}): Tensor {
  const [b, , tq] = q.shape;
  const tk = k.shape[2];
  const mask = attentionMask(b, tq, tk, keyMask, options.window);
  const cap = options.softcap;
  if (cap === undefined) return scaledDotProductAttention(q, k, v, { causal: true, mask, scale: options.scale });
  const scale = options.scale ?? 1 / Math.sqrt(q.shape[3]);
  const scores = matmul(q, k.transpose(-2, -1)).mul(scale).div(cap).tanh().mul(cap); // [B, H, Tq, Tk]
  return matmul(maskedSoftmax(scores, 1, true, mask), v); // [B, H, Tq, D]
}
