import { unpackMatrix } from '../../../quant/formats.ts';
import type { CrossEntropyOptions } from '../../../ops/loss.ts';
import type { Tensor } from '../../../tensor.ts';
import { type GraphBuilder, GraphValue, refuse } from '../builder.ts';
import type { LoweringTable } from '../lowerings.ts';
import { axis, broadcast } from './common.ts';

/**
 * The model ops: softmax and log-softmax, the attention ops (maskedSoftmax, scaledDotProductAttention; attendTimeMajor
 * is refused), layer and RMS norm, rotary embeddings, cross-entropy, and a mixture of experts' routed experts.
 */

/** The value a blocked score takes before the softmax: exp(it − a row's max) is 0 for any score a model makes. */
const BLOCKED = -1e30;

/** `x` as a graph value, or a refusal naming what it is. */
function value(x: unknown, what: string): GraphValue {
  if (x instanceof GraphValue) return x;
  return refuse(`${what} is not a tensor`);
}

/** A value that may be absent (null or undefined). */
function optional(x: unknown, what: string): GraphValue | null {
  return x === null || x === undefined ? null : value(x, what);
}

/**
 * The js kernel's softmax along `dim` (ONNX Softmax, any axis). A row that is −∞ everywhere is NaN here where js
 * gives zeros: masked rows go through maskedSoftmax, which gives zeros as js does.
 */
function softmax(g: GraphBuilder, x: unknown, dim: unknown = -1): GraphValue {
  const v = value(x, 'softmax\'s input');
  return g.node('Softmax', [v], { shape: v.shape, type: v.type }, { axis: axis(dim as number, v.rank) });
}

function logSoftmax(g: GraphBuilder, x: unknown, dim: unknown = -1): GraphValue {
  const v = value(x, 'logSoftmax\'s input');
  return g.node('LogSoftmax', [v], { shape: v.shape, type: v.type }, { axis: axis(dim as number, v.rank) });
}

/**
 * softmax(scale · scores) over the last dim of scores [B, H, Tq, Tk] with the causal mask (offset by Tk − Tq) and the
 * user's mask (non-zero where a query may attend a key, broadcast to the scores): a blocked key gets BLOCKED before
 * the softmax, and where a row may have every key blocked the probabilities are multiplied by the allowed keys
 * (0 or 1), so that such a row is zeros as js makes it (a softmax of a row of equal values is uniform, not zero).
 */
function maskedSoftmax(g: GraphBuilder, scores: unknown, scale: unknown, causal: unknown, mask: unknown): GraphValue {
  const x = value(scores, 'maskedSoftmax\'s scores');
  const m = optional(mask, 'the attention mask');
  if (x.rank !== 4) refuse(`scores of rank ${x.rank}, not [B, H, Tq, Tk]`);
  if (typeof scale !== 'number' || typeof causal !== 'boolean') refuse('a scale that is not a number or a causal flag that is not a boolean');
  const [tq, tk] = x.shape.slice(2);
  let s = scale === 1 ? x : g.node('Mul', [x, g.scalar(scale)]);
  let keep: GraphValue | null = null;
  /** Where the causal mask allows a key (1) or not (0): with a user's mask too, a row blocked by it keeps no future key. */
  let causalKeep: GraphValue | null = null;
  if (causal) {
    const offset = tk - tq;
    const bias = new Float32Array(tq * tk);
    const allowed = new Float32Array(tq * tk);
    for (let i = 0; i < tq; i++) {
      for (let j = 0; j < tk; j++) {
        const ok = j <= i + offset;
        bias[i * tk + j] = ok ? 0 : BLOCKED;
        allowed[i * tk + j] = ok ? 1 : 0;
      }
    }
    s = g.node('Add', [s, g.constant(bias, [tq, tk], 'float32')], { shape: x.shape, type: x.type });
    causalKeep = g.constant(allowed, [tq, tk], 'float32');
    // with fewer keys than queries, the first queries see no key at all
    if (offset < 0) keep = causalKeep;
  }
  if (m !== null) {
    if (m.type !== 'int32' && m.type !== 'float32') refuse(`an attention mask of ${m.type}`);
    const blocked = g.node('Equal', [m, g.scalar(0, m.type)], { shape: m.shape, type: 'bool' });
    s = g.node('Where', [blocked, g.scalar(BLOCKED), s], { shape: x.shape, type: x.type });
    const base = causalKeep ?? g.scalar(1);
    keep = g.node('Where', [blocked, g.scalar(0), base], { shape: broadcast(m.shape, base.shape), type: 'float32' });
  }
  const p = g.node('Softmax', [s], { shape: x.shape, type: x.type }, { axis: 3 });
  return keep === null ? p : g.node('Mul', [p, keep], { shape: x.shape, type: x.type });
}

/** q [B, H, Tq, D] against k [B, H, Tk, D] and v [B, H, Tk, Dv] (batch dims broadcast as matmul's): [B, H, Tq, Dv]. */
function scaledDotProductAttention(g: GraphBuilder, q: unknown, k: unknown, v: unknown, options: unknown = {}): GraphValue {
  const [qv, kv, vv] = [value(q, 'q'), value(k, 'k'), value(v, 'v')];
  if (qv.rank !== 4 || kv.rank !== 4 || vv.rank !== 4) refuse('attention of q, k, v not all of rank 4');
  const o = (options ?? {}) as { causal?: unknown; mask?: unknown; scale?: unknown };
  const [tq, d] = qv.shape.slice(2);
  const tk = kv.shape[2];
  const kt = g.node('Transpose', [kv], { shape: [kv.shape[0], kv.shape[1], d, tk], type: kv.type }, { perm: [0, 1, 3, 2] });
  const scores = g.node('MatMul', [qv, kt], { shape: [...broadcast(qv.shape.slice(0, 2), kv.shape.slice(0, 2)), tq, tk], type: qv.type });
  const p = maskedSoftmax(g, scores, o.scale ?? 1 / Math.sqrt(d), o.causal ?? false, o.mask ?? null);
  return g.node('MatMul', [p, vv], { shape: [...broadcast(p.shape.slice(0, 2), vv.shape.slice(0, 2)), tq, vv.shape[3]], type: qv.type });
}

/**
 * Refused: attendTimeMajor reads its keys and values from host buffers (a TimeMajorKV, an attribute of the call), not
 * from tensors of the step; a graph could only hold them as they were when it was built, where a replay reads them
 * as they are.
 */
function attendTimeMajor(): never {
  return refuse('its keys and values are host buffers (TimeMajorKV), not tensors of the step: a graph would hold them as they were when built');
}

/** ONNX LayerNormalization over the last dim (biased variance, as js); a missing weight is ones, a missing bias zeros. */
function layerNorm(g: GraphBuilder, x: unknown, weight: unknown, bias: unknown, eps: unknown = 1e-5): GraphValue {
  const v = value(x, 'layerNorm\'s input');
  const n = v.shape[v.rank - 1];
  const w = optional(weight, 'layerNorm\'s weight') ?? g.constant(new Float32Array(n).fill(1), [n], 'float32');
  const b = optional(bias, 'layerNorm\'s bias');
  // an omitted trailing input is left out, not named '' (onnxruntime 1.30 crashes on LayerNormalization's)
  return g.node('LayerNormalization', b === null ? [v, w] : [v, w, b], { shape: v.shape, type: v.type }, { axis: -1, epsilon: { float: eps as number } });
}

/** x / sqrt(mean(x²) + eps) · w over the last dim, the weight as given (a family's 1 + w is an add before the op). */
function rmsNorm(g: GraphBuilder, x: unknown, weight: unknown, eps: unknown = 1e-6): GraphValue {
  const v = value(x, 'rmsNorm\'s input');
  const w = optional(weight, 'rmsNorm\'s weight');
  const rows = [...v.shape.slice(0, -1), 1];
  const squares = g.node('Mul', [v, v]);
  const mean = g.node('ReduceMean', [squares], { shape: rows, type: v.type }, { axes: [-1], keepdims: 1 });
  const root = g.node('Sqrt', [g.node('Add', [mean, g.scalar(eps as number)], { shape: rows, type: v.type })]);
  const y = g.node('Mul', [v, g.node('Reciprocal', [root])], { shape: v.shape, type: v.type });
  return w === null ? y : g.node('Mul', [y, w], { shape: v.shape, type: v.type });
}

/** y = x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂, x₁]: x [B, H, T, D], cos and sin [B or 1, T, D]. */
function rotaryEmbedding(g: GraphBuilder, x: unknown, cos: unknown, sin: unknown): GraphValue {
  const v = value(x, 'rotaryEmbedding\'s input');
  const [c, s] = [value(cos, 'cos'), value(sin, 'sin')];
  if (v.rank !== 4 || c.rank !== 3 || s.rank !== 3) refuse('rotary embeddings other than x [B, H, T, D] with cos and sin [B, T, D]');
  const [b, h, t, d] = v.shape;
  const half = d / 2;
  const part = (from: number, to: number) =>
    g.node('Slice', [v, g.ints([from]), g.ints([to]), g.ints([3])], { shape: [b, h, t, half], type: v.type });
  const rotated = g.node('Concat', [g.node('Neg', [part(half, d)]), part(0, half)], { shape: v.shape, type: v.type }, { axis: 3 });
  const table = (u: GraphValue) => g.reshape(u, [u.shape[0], 1, t, d]);
  const a = g.node('Mul', [v, table(c)], { shape: v.shape, type: v.type });
  const r = g.node('Mul', [rotated, table(s)], { shape: v.shape, type: v.type });
  return g.node('Add', [a, r], { shape: v.shape, type: v.type });
}

/**
 * Cross-entropy of logits [..., C] against int32 targets [...]: each row's −log-softmax at its target (picked by
 * comparing the target with every class, so an ignored target outside [0, C) picks nothing), 0 where the target is
 * ignoreIndex; then per position ('none'), summed, or the mean over the kept targets (or over `divisor`).
 */
function crossEntropy(g: GraphBuilder, logits: unknown, targets: unknown, options: unknown = {}): GraphValue {
  const x = value(logits, 'the logits');
  const t = value(targets, 'the targets');
  if (t.type !== 'int32') refuse(`targets of ${t.type}`);
  const { ignoreIndex = -100, reduction = 'mean', divisor } = (options ?? {}) as CrossEntropyOptions;
  const c = x.shape[x.rank - 1];
  const rows = x.size / c;
  const logp = g.node('LogSoftmax', [g.reshape(x, [rows, c])], { shape: [rows, c], type: x.type }, { axis: 1 });
  const column = g.reshape(t, [rows, 1]);
  const classes = g.constant(Int32Array.from({ length: c }, (_, i) => i), [c], 'int32');
  const hit = g.node('Equal', [classes, column], { shape: [rows, c], type: 'bool' });
  const picked = g.node('Where', [hit, logp, g.scalar(0)], { shape: [rows, c], type: x.type });
  const sum = g.node('ReduceSum', [picked, g.ints([1])], { shape: [rows], type: x.type }, { keepdims: 0 });
  const ignored = g.node('Equal', [g.reshape(t, [rows]), g.scalar(ignoreIndex, 'int32')], { shape: [rows], type: 'bool' });
  const losses = g.node('Where', [ignored, g.scalar(0), g.node('Neg', [sum])], { shape: [rows], type: x.type });
  if (reduction === 'none') return g.reshape(losses, t.shape);
  const total = g.node('ReduceSum', [losses], { shape: [], type: x.type }, { keepdims: 0 });
  if (reduction === 'sum') return total;
  if (divisor !== undefined) return g.node('Div', [total, g.scalar(divisor)], { shape: [], type: x.type });
  const kept = g.node('Where', [ignored, g.scalar(0), g.scalar(1)], { shape: [rows], type: x.type });
  const count = g.node('ReduceSum', [kept], { shape: [], type: x.type }, { keepdims: 0 });
  return g.node('Div', [total, count], { shape: [], type: x.type });
}

/** What routedExperts reads of a sparse MoE block (src/models/moe.ts' SparseMoe; typed by shape, as tensor/ does not import models/). */
interface MoeLike {
  spec: { experts: number; topK: number; normTopK: boolean };
  experts: { at(e: number): Record<'gate' | 'up' | 'down', LinearLike> };
}

interface LinearLike {
  weight: Tensor;
  bias: Tensor | null;
  lora: unknown;
}

function isMoe(x: unknown): x is MoeLike {
  const m = x as Partial<MoeLike> | null;
  return typeof m === 'object' && m !== null && typeof m.spec?.experts === 'number' && typeof m.experts?.at === 'function';
}

/**
 * Every expert's matrix `which` [out, in] as one constant [E, in, out] (each transposed, so x [N, in] times it is
 * [E, N, out]), baked into the graph with the values it has now: an optimizer's later update of an expert's weight is
 * not seen by a graph built before it (build the graph again).
 */
function bakedExperts(g: GraphBuilder, moe: MoeLike, which: 'gate' | 'up' | 'down'): GraphValue {
  const e = moe.spec.experts;
  let rows = 0;
  let cols = 0;
  let values = new Float32Array(0);
  for (let i = 0; i < e; i++) {
    const l = moe.experts.at(i)[which];
    const w = l.weight;
    if (l.lora !== null || l.bias !== null) refuse('an expert with LoRA factors or a bias');
    if (w.dtype !== 'float32' || w.deviceStorage !== null || w.ndim !== 2) {
      refuse(`an expert weight that is not a float32 matrix on the host ([${w.shape}] ${w.dtype})`);
    }
    if (i === 0) [rows, cols, values] = [w.shape[0], w.shape[1], new Float32Array(e * w.size)];
    if (w.shape[0] !== rows || w.shape[1] !== cols) refuse('experts of different sizes');
    // a compact expert (bf16, int8, int4) as the float32 values the js kernels dequantize it to
    const src = w.packed === null ? (w.data as Float32Array) : unpackMatrix(w.packed);
    const base = i * rows * cols;
    for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) values[base + c * rows + r] = src[r * cols + c];
  }
  return g.constant(values, [e, cols, rows], 'float32');
}

/**
 * A sparse MoE block's routed experts (the compositeOp of src/models/moe.ts: moe, flat [N, H], probs [N, E]) computed
 * densely: every expert on every row, each row's outputs weighted by its top-k routing weights (TopK, ties to the
 * lower index as torch.topk; renormalised with normTopK) and zero for the experts it did not pick, then summed:
 * what the sparse path computes, to float32 rounding. The experts' weights are not tensors of the step (they are the
 * block's, an attribute of the call): they are baked into the graph as constants (bakedExperts), so a graph built
 * before an optimizer's step computes with the weights as they were.
 */
function routedExperts(g: GraphBuilder, moe: unknown, flat: unknown, probs: unknown): GraphValue {
  if (!isMoe(moe)) return refuse('routedExperts of something else than a sparse MoE block');
  const x = value(flat, 'the rows');
  const p = value(probs, 'the router\'s probabilities');
  const { experts: e, topK: k, normTopK } = moe.spec;
  const [n, h] = x.shape;
  if (x.rank !== 2 || p.rank !== 2 || p.shape[1] !== e || p.shape[0] !== n) refuse(`rows [${x.shape}] and probabilities [${p.shape}] of ${e} experts`);
  const [top, picked] = g.multi('TopK', [p, g.ints([k])], [{ shape: [n, k], type: p.type }, { shape: [n, k], type: 'int64' }], { axis: 1 });
  const weights = normTopK
    ? g.node('Div', [top, g.node('ReduceSum', [top, g.ints([1])], { shape: [n, 1], type: p.type }, { keepdims: 1 })], { shape: [n, k], type: p.type })
    : top;
  const experts = g.constant(BigInt64Array.from({ length: e }, (_, i) => BigInt(i)), [e], 'int64');
  const hit = g.node('Equal', [g.reshape(picked, [n, k, 1]), experts], { shape: [n, k, e], type: 'bool' });
  const spread = g.node('Where', [hit, g.reshape(weights, [n, k, 1]), g.scalar(0)], { shape: [n, k, e], type: p.type });
  const routing = g.node('ReduceSum', [spread, g.ints([1])], { shape: [n, e], type: p.type }, { keepdims: 0 }); // [N, E]
  const wg = bakedExperts(g, moe, 'gate'); // [E, H, W]
  const inner = { shape: [e, n, wg.shape[2]], type: x.type };
  const a = g.node('MatMul', [x, wg], inner);
  const silu = g.node('Mul', [a, g.node('Sigmoid', [a])], inner);
  const mid = g.node('Mul', [silu, g.node('MatMul', [x, bakedExperts(g, moe, 'up')], inner)], inner);
  const y = g.node('MatMul', [mid, bakedExperts(g, moe, 'down')], { shape: [e, n, h], type: x.type });
  const scale = g.reshape(g.node('Transpose', [routing], { shape: [e, n], type: p.type }, { perm: [1, 0] }), [e, n, 1]);
  const weighted = g.node('Mul', [y, scale], { shape: [e, n, h], type: x.type });
  return g.node('ReduceSum', [weighted, g.ints([0])], { shape: [n, h], type: x.type }, { keepdims: 0 });
}

export const MODEL_OPS: LoweringTable = {
  softmax,
  logSoftmax,
  maskedSoftmax,
  scaledDotProductAttention,
  attendTimeMajor,
  layerNorm,
  rmsNorm,
  rotaryEmbedding,
  crossEntropy,
  routedExperts,
};
