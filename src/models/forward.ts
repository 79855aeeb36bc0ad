import { InvalidArgumentError } from '../errors.ts';
import { attendTimeMajor, cat, isGradEnabled, isTracing, type Tensor, tensor } from '../tensor/index.ts';
import { type AttentionOptions, causalAttention } from './attention.ts';
import { type ForwardContext, type ForwardOptions, type ModelLayer } from './model.ts';

/** Positions 0..T−1 after `offset` for every row: int32 [B, T]. */
export function defaultPositions(batch: number, length: number, offset: number): Tensor {
  const data = new Int32Array(batch * length);
  for (let b = 0; b < batch; b++) for (let t = 0; t < length; t++) data[b * length + t] = offset + t;
  return tensor(data, [batch, length], 'int32');
}

/**
 * Runs the input through every layer in order: ids [B, T] when the first layer is the
 * embedding, hidden states [B, T, H] otherwise (a section of a model).
 */
export function runLayers(layers: readonly ModelLayer[], ids: Tensor, options: ForwardOptions, maxPositions: number): Tensor {
  if (layers[0]?.kind === 'embedding' && (ids.dtype !== 'int32' || ids.ndim !== 2)) {
    throw new InvalidArgumentError(`token ids must be int32 [batch, time], got ${ids.dtype} [${ids.shape}]`);
  }
  if (layers[0]?.kind !== 'embedding' && ids.ndim !== 3) {
    throw new InvalidArgumentError(`this section starts after the embedding: it takes hidden states [batch, time, hidden], got [${ids.shape}]`);
  }
  const [b, t] = ids.shape;
  const cache = options.cache ?? null;
  const past = cache?.length ?? 0;
  const positions = options.positions ?? defaultPositions(b, t, past);
  let maxPos = 0;
  for (const p of positions.data) maxPos = Math.max(maxPos, p);
  if (maxPos >= maxPositions) {
    throw new InvalidArgumentError(`position ${maxPos} is past the model's ${maxPositions} positions`);
  }
  const keyMask = options.keyMask ?? null;
  if (keyMask && (keyMask.shape[0] !== b || keyMask.shape[1] !== past + t)) {
    throw new InvalidArgumentError(`keyMask [${keyMask.shape}] must be [${b}, ${past + t}]`);
  }
  const ctx: ForwardContext = { positions, keyMask, cache };
  let x = ids;
  for (const layer of layers) x = layer.forward(x, ctx);
  return x;
}

/**
 * Causal attention for one block with the cache: appends the new keys/values
 * ([B, kvHeads, T, D]) to the layer's cache entry and attends over all of them (within the
 * sliding window of `options`, if any: the cache keeps every key, the window masks the old ones).
 * Grouped-query attention repeats each key/value head for `groups` query heads. The cache grows in
 * place (GrowingKV, or by pages: PagedKV) and, where no mask, window or soft-cap applies and no gradient is wanted,
 * attendTimeMajor reads the keys where they lie: no step copies the whole cache. While a trace records, the cache is
 * plain tensors joined with `cat` instead, so that a replay grows the cache it is given.
 */
export function cachedAttention(
  q: Tensor,
  k: Tensor,
  v: Tensor,
  ctx: ForwardContext,
  blockIndex: number,
  groups = 1,
  options: AttentionOptions = {},
): Tensor {
  let keys = k;
  let values = v;
  const cache = ctx.cache;
  if (cache && (k.dtype !== 'float32' || v.dtype !== 'float32' || isTracing())) {
    // a model run in float64 (gradient checks), or traced (src/tensor/trace.ts: the grown cache a result of recorded
    // ops, not host state a replay would take as it was): the cache as plain tensors, concatenated
    const previous = cache.layers[blockIndex];
    if (previous) {
      keys = cat([previous.k, k], 2);
      values = cat([previous.v, v], 2);
    }
    const slot = previous?.slot;
    if (previous && slot) {
      // a bounded cache: attend over its C slots and the new key (the keys mask says which slots count), and write
      // the new key and value into the slot `slot` marks: k + (new − k) · slot, the same C slots out
      cache.layers[blockIndex] = {
        k: previous.k.add(k.sub(previous.k).mul(slot)).detach(),
        v: previous.v.add(v.sub(previous.v).mul(slot)).detach(),
        slot,
      };
    } else cache.layers[blockIndex] = { k: keys.detach(), v: values.detach() };
  } else if (cache) {
    const previous = cache.layers[blockIndex];
    const grads = isGradEnabled() && (q.requiresGrad || k.requiresGrad || v.requiresGrad);
    // gradients flow to the new keys and values (the cached ones, taken before a paged entry grows, are detached)
    if (grads && previous) {
      keys = cat([previous.k, k], 2);
      values = cat([previous.v, v], 2);
    }
    const entry = cache.append(blockIndex, k, v);
    if (!grads) {
      const window = options.window;
      const plain = ctx.keyMask === null && options.softcap === undefined && (window === undefined || entry.length <= window);
      if (plain && q.dtype === 'float32') return attendTimeMajor(q, entry.timeMajor, options.scale);
      keys = entry.k;
      values = entry.v;
    }
  }
  if (groups > 1) {
    keys = repeatKv(keys, groups);
    values = repeatKv(values, groups);
  }
  return causalAttention(q, keys, values, ctx.keyMask, options);
}

/** [B, Hkv, T, D] → [B, Hkv·groups, T, D], each head repeated `groups` times in place (HF's repeat_kv). */
export function repeatKv(x: Tensor, groups: number): Tensor {
  const [b, h, t, d] = x.shape;
  return x
    .unsqueeze(2)
    .expand([b, h, groups, t, d])
    .reshape([b, h * groups, t, d]);
}

/** [B, T, H·D] → [B, H, T, D] (one token, as when decoding: the same order of values, so no copy) */
export function splitHeads(x: Tensor, heads: number): Tensor {
  const [b, t, hd] = x.shape;
  return t === 1 ? x.reshape([b, heads, 1, hd / heads]) : x.reshape([b, t, heads, hd / heads]).transpose(1, 2);
}

/** [B, H, T, D] → [B, T, H·D] */
export function mergeHeads(x: Tensor): Tensor {
  const [b, h, t, d] = x.shape;
  return (t === 1 ? x : x.transpose(1, 2)).reshape([b, t, h * d]);
}
