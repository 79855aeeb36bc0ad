import { Linear, RMSNorm } from '../../nn/index.ts';
import { attendTimeMajor, gatedMlp, getBackend, isGradEnabled, isTracing, linear, linears, Tensor } from '../../tensor/index.ts';
import { entryLength, type ForwardContext } from '../model.ts';

/**
 * One decoding step of a shared-decoder block (decoder.ts) (one token of one sequence, with the cache) on the backend's fused products,
 * with the glue between them — norms, rotary, the cache's append, residual adds — on plain buffers instead of a
 * dozen tensor ops: on a backend with fused products (ort), each op's few µs of shapes, records and buffers were a
 * sixth of a step of the 100M shared decoder at int4 (bench/decode-profile.ts). Each loop computes what its op does (rmsNorm,
 * rotaryEmbedding, add), so it is the generic block's arithmetic; where a backend has no fused products (js) or
 * anything else differs (gradients, batches, masks, windows, biases, q/k norms, partial rotary, replaced forwards),
 * the generic block runs.
 */

/** What a shared-decoder block holds, as the step reads it. */
export interface DecodeBlock {
  input_layernorm: RMSNorm;
  post_attention_layernorm: RMSNorm;
  self_attn: { q_proj: Linear; k_proj: Linear; v_proj: Linear; o_proj: Linear; q_norm: object | null };
  mlp: { gate_proj: Linear; up_proj: Linear; down_proj: Linear };
}

export interface DecodeShape {
  heads: number;
  kvHeads: number;
  headDim: number;
  /** The block's sliding window, if any. */
  window: number | undefined;
}

/** A module whose forward is its class's own (not replaced on the instance). */
function own(m: object, cls: { prototype: object }): boolean {
  return Object.getPrototypeOf(m) === cls.prototype && !Object.hasOwn(m, 'forward');
}

/** Whether the step may run this block for x [1, 1, hidden] (see the module's comment). */
export function canDecodeStep(
  block: DecodeBlock, x: Tensor, ctx: ForwardContext, blockIndex: number, shape: DecodeShape, rope: { cos: Tensor },
): boolean {
  const b = getBackend();
  if (!b.linears || !b.gatedMlp || !b.attention) return false;
  return decodeStepFits(block, x, ctx, blockIndex, shape, rope);
}

/**
 * Whether the step's arithmetic is this block's for x [1, 1, hidden], whatever the backend: no gradients, a cache, no
 * mask, one float32 token, a plain shared-decoder block, the cache within its window (what a batched step, decode-batch.ts, asks).
 */
export function decodeStepFits(
  block: DecodeBlock, x: Tensor, ctx: ForwardContext, blockIndex: number, shape: DecodeShape, rope: { cos: Tensor },
): boolean {
  // a trace records ops: the step on plain buffers would be taken once, as traced (src/tensor/trace.ts)
  if (isGradEnabled() || isTracing() || ctx.cache === null || ctx.keyMask !== null) return false;
  if (x.ndim !== 3 || x.shape[0] !== 1 || x.shape[1] !== 1 || x.dtype !== 'float32' || rope.cos.shape[2] !== shape.headDim) return false;
  const { self_attn: a, mlp } = block;
  const projections = [a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj];
  if (a.q_norm !== null || !projections.every((l) => own(l, Linear) && l.bias === null)) return false;
  if (!own(block.input_layernorm, RMSNorm) || !own(block.post_attention_layernorm, RMSNorm)) return false;
  const past = ctx.cache.layers[blockIndex];
  const length = (past ? entryLength(past) : 0) + 1;
  return shape.window === undefined || length <= shape.window;
}

/** y = rmsNorm(x, w, eps) over one row, as ops/norm.ts computes it. */
export function rmsNormRow(x: Float32Array, norm: RMSNorm): Float32Array {
  const n = x.length;
  const w = norm.weight.data;
  let ss = 0;
  for (let j = 0; j < n; j++) ss += x[j] * x[j];
  const rs = 1 / Math.sqrt(ss / n + norm.eps);
  const y = new Float32Array(n);
  for (let j = 0; j < n; j++) y[j] = x[j] * rs * w[j];
  return y;
}

/** Rotates every head of x [heads · D] in place, as rotaryEmbedding does for one position (cos, sin [D]). */
export function rotate(x: Float32Array, heads: number, d: number, cos: ArrayLike<number>, sin: ArrayLike<number>): void {
  const half = d / 2;
  for (let h = 0; h < heads; h++) {
    const row = h * d;
    for (let i = 0; i < half; i++) {
      const x1 = x[row + i];
      const x2 = x[row + i + half];
      x[row + i] = x1 * cos[i] - x2 * sin[i];
      x[row + i + half] = x2 * cos[i + half] + x1 * sin[i + half];
    }
  }
}

/** x + y as a new row (the residual stream). */
export function addRows(x: Float32Array, y: Float32Array): Float32Array {
  const out = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] + y[i];
  return out;
}

/** The block's output [1, 1, hidden] for x [1, 1, hidden]; canDecodeStep must hold. */
export function decodeStep(
  block: DecodeBlock, x: Tensor, ctx: ForwardContext, blockIndex: number, shape: DecodeShape, rope: { cos: Tensor; sin: Tensor },
): Tensor {
  const { heads, kvHeads, headDim: d } = shape;
  const { self_attn: a, mlp } = block;
  const xs = x.data as Float32Array;
  const h = new Tensor(rmsNormRow(xs, block.input_layernorm), x.shape);
  const [q, k, v] = linears(h, [a.q_proj, a.k_proj, a.v_proj]).map((t) => t.data as Float32Array);
  const cos = rope.cos.data;
  const sin = rope.sin.data;
  rotate(q, heads, d, cos, sin);
  rotate(k, kvHeads, d, cos, sin);
  const cache = ctx.cache!;
  const entry = cache.append(blockIndex, new Tensor(k, [1, kvHeads, 1, d]), new Tensor(v, [1, kvHeads, 1, d]));
  const y = attendTimeMajor(new Tensor(q, [1, heads, 1, d]), entry.timeMajor); // [1, nh, 1, hd]: merged heads, as they lie
  const o = linear(new Tensor(y.data, [1, 1, heads * d]), a.o_proj.weight).data as Float32Array;
  const x2 = addRows(xs, o);
  const h2 = new Tensor(rmsNormRow(x2, block.post_attention_layernorm), x.shape);
  const m = gatedMlp(h2, mlp.gate_proj, mlp.up_proj, mlp.down_proj).data as Float32Array;
  return new Tensor(addRows(x2, m), x.shape);
}
