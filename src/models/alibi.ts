import { cat, maskedSoftmax, matmul, type Tensor, tensor } from '../tensor/index.ts';
import type { ForwardContext, LayerCache } from './model.ts';

/**
 * ALiBi (attention with linear biases, Press et al. 2021) as transformers computes it: no rotary or
 * learned positions; each head h adds slope_h · (position of the key) to its attention scores,
 * which, softmax being blind to a shift shared by a row, is the paper's −slope_h · distance.
 */

/**
 * The slope of each head, in float32 as transformers' build_alibi_tensor: powers of
 * 2^(−8/n) for the largest power of two n ≤ heads, then odd powers of 2^(−4/n) for the rest.
 */
export function alibiSlopes(heads: number): Float32Array {
  const closest = 2 ** Math.floor(Math.log2(heads));
  const base = Math.fround(2 ** -(2 ** -(Math.log2(closest) - 3)));
  const slopes = new Float32Array(heads);
  for (let i = 0; i < closest; i++) slopes[i] = base ** (i + 1);
  if (closest !== heads) {
    const extra = Math.fround(2 ** -(2 ** -(Math.log2(2 * closest) - 3)));
    for (let i = 0; i < heads - closest; i++) slopes[closest + i] = extra ** (2 * i + 1);
  }
  return slopes;
}

/**
 * The bias of every head on every key: [B, H, 1, Tk], slope × the key's position. The keys
 * are the cached ones and the new ones, the last of them a row's newest token at its position
 * in `ctx.positions`, the others at the positions before it (positions count a row's real
 * tokens, as transformers' cumsum of the attention mask: left padding, masked out by
 * `ctx.keyMask`, comes first, and its position, 0 here as there, does not count).
 */
function alibiBias(slopes: Float32Array, ctx: ForwardContext, keys: number): Tensor {
  const [b, t] = ctx.positions.shape;
  const h = slopes.length;
  const bias = new Float32Array(b * h * keys);
  for (let bi = 0; bi < b; bi++) {
    const first = ctx.positions.data[bi * t + t - 1] - (keys - 1); // the position of key 0
    for (let hi = 0; hi < h; hi++) {
      const row = (bi * h + hi) * keys;
      for (let j = 0; j < keys; j++) bias[row + j] = slopes[hi] * Math.max(0, first + j);
    }
  }
  return tensor(bias, [b, h, 1, keys]);
}

/**
 * Causal attention with ALiBi for one block, with the KV cache as in cachedAttention:
 * softmax(scale · q kᵀ + bias) v, the bias added after the scale as transformers' baddbmm does.
 * q, k, v are [B, H, T, D]; returns [B, H, T, D].
 */
export function alibiAttention(
  q: Tensor,
  k: Tensor,
  v: Tensor,
  ctx: ForwardContext,
  blockIndex: number,
  slopes: Float32Array,
  scale: number,
): Tensor {
  let keys = k;
  let values = v;
  const cache = ctx.cache;
  if (cache?.pool) {
    // a paged cache (a host's session, a served row): its pages hold the keys, read back whole here
    const entry = cache.append(blockIndex, k.detach(), v.detach());
    keys = entry.k;
    values = entry.v;
  } else if (cache) {
    const entry: LayerCache | null = cache.layers[blockIndex];
    if (entry) {
      keys = cat([entry.k, k], 2);
      values = cat([entry.v, v], 2);
    }
    cache.layers[blockIndex] = { k: keys.detach(), v: values.detach() };
  }
  const [b] = q.shape;
  const tk = keys.shape[2];
  const scores = matmul(q, keys.transpose(-2, -1)).mul(scale).add(alibiBias(slopes, ctx, tk)); // [B, H, T, Tk]
  const mask = ctx.keyMask ? ctx.keyMask.reshape([b, 1, 1, tk]) : null;
  return matmul(maskedSoftmax(scores, 1, true, mask), values); // [B, H, T, D]
}
