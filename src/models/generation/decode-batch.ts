import { attendTimeMajor, gatedMlp, isTracing, linear, linears, Tensor } from '../../tensor/index.ts';
import { addRows, rmsNormRow, rotate } from './decode-step.ts';
import { Decoder, DecoderBlock, type DecodePlan } from '../decoder.ts';
import { type CausalLM, type ForwardContext, type KVCache, type ModelLayer } from '../model.ts';

/**
 * A batched decoding step: one token of each of several sequences, each with its own KV cache and position (different
 * users' sessions on one host). Every projection of a block (q/k/v, o, the MLP) runs once over the rows stacked, so
 * its weights are read once for all of them; each row's norms, rotary, cache append and attention run on its own, as
 * decode-step.ts computes them. On js every product's output is a double-precision sum over its own row (the kernels
 * never mix rows), so each row's output equals its own forward bit for bit; on ort within float tolerance. A layer
 * that is not a plain shared-decoder block (or a row it cannot take) runs row by row through the layer's own forward.
 */

/** One sequence's step: its hidden state [1, 1, hidden], its cache, its position int32 [1, 1]. */
export interface DecodeRow {
  x: Tensor;
  cache: KVCache;
  positions: Tensor;
}

/** Each row's output [1, 1, hidden] after the model's layers: what `model.forward(row.x, row)` gives, one row at a time. */
export function decodeRows(model: CausalLM, rows: readonly DecodeRow[]): Tensor[] {
  if (!canDecodeRows(model, rows)) return rows.map((r) => model.forward(r.x, { cache: r.cache, positions: r.positions }));
  const ctxs: ForwardContext[] = rows.map((r) => ({ positions: r.positions, keyMask: null, cache: r.cache }));
  let xs = rows.map((r) => r.x);
  for (const layer of model.layers) {
    const block = blockOf(model as Decoder, layer);
    const plans = block ? xs.map((x, i) => block.decodePlan(x, ctxs[i], layer.blockIndex)) : [];
    xs = block && plans.every((p) => p !== null)
      ? decodeBlockRows(plans as DecodePlan[], xs, ctxs, layer.blockIndex)
      : xs.map((x, i) => layer.forward(x, ctxs[i]));
  }
  return xs;
}

/**
 * Whether the rows may be stacked: a shared-decoder model or section, one token each (ids [1, 1] or hidden states [1, 1, hidden]),
 * positions given and in range, distinct caches.
 */
export function canDecodeRows(model: CausalLM, rows: readonly DecodeRow[]): boolean {
  // while a trace records, rows run through the model's forward (its ops), not on plain buffers (src/tensor/trace.ts)
  if (rows.length < 2 || isTracing() || !(model instanceof Decoder) || new Set(rows.map((r) => r.cache)).size !== rows.length) return false;
  const ids = model.layers[0]?.kind === 'embedding';
  const { hidden, maxPositions } = model.config;
  return rows.every(({ x, positions: p }) => x.shape[0] === 1 && x.shape[1] === 1
    && (ids ? x.ndim === 2 && x.dtype === 'int32' : x.ndim === 3 && x.shape[2] === hidden && x.dtype === 'float32')
    && p.dtype === 'int32' && p.ndim === 2 && p.size === 1 && p.data[0] >= 0 && p.data[0] < maxPositions);
}

function blockOf(model: Decoder, layer: ModelLayer): DecoderBlock | null {
  if (layer.kind !== 'block') return null;
  const block = model.model.layers.byIndex(layer.blockIndex);
  return block instanceof DecoderBlock ? block : null;
}

/** One block over R rows: the products over the rows stacked, the rest row by row (decodeStep's arithmetic). */
function decodeBlockRows(
  plans: readonly DecodePlan[], xs: readonly Tensor[], ctxs: readonly ForwardContext[], blockIndex: number,
): Tensor[] {
  const r = xs.length;
  const { block, shape } = plans[0];
  const { heads, kvHeads, headDim: d } = shape;
  const { self_attn: a, mlp } = block;
  const hidden = xs[0].shape[2];
  const stacked = (rowsOf: (i: number) => Float32Array, width: number) => {
    const out = new Float32Array(r * width);
    for (let i = 0; i < r; i++) out.set(rowsOf(i), i * width);
    return new Tensor(out, [r, 1, width]);
  };
  const h = stacked((i) => rmsNormRow(xs[i].data as Float32Array, block.input_layernorm), hidden);
  const [q, k, v] = linears(h, [a.q_proj, a.k_proj, a.v_proj]).map((t) => t.data as Float32Array);
  const qw = heads * d;
  const kw = kvHeads * d;
  const y = new Float32Array(r * qw);
  for (let i = 0; i < r; i++) {
    const { cos, sin } = plans[i].rope;
    const qi = q.subarray(i * qw, (i + 1) * qw);
    const ki = k.subarray(i * kw, (i + 1) * kw);
    rotate(qi, heads, d, cos.data, sin.data);
    rotate(ki, kvHeads, d, cos.data, sin.data);
    const cache = ctxs[i].cache!;
    const vi = v.subarray(i * kw, (i + 1) * kw);
    const entry = cache.append(blockIndex, new Tensor(ki, [1, kvHeads, 1, d]), new Tensor(vi, [1, kvHeads, 1, d]));
    y.set(attendTimeMajor(new Tensor(qi, [1, heads, 1, d]), entry.timeMajor).data, i * qw);
  }
  const o = linear(new Tensor(y, [r, 1, qw]), a.o_proj.weight).data as Float32Array;
  const x2 = xs.map((x, i) => addRows(x.data as Float32Array, o.subarray(i * hidden, (i + 1) * hidden)));
  const h2 = stacked((i) => rmsNormRow(x2[i], block.post_attention_layernorm), hidden);
  const m = gatedMlp(h2, mlp.gate_proj, mlp.up_proj, mlp.down_proj).data as Float32Array;
  return x2.map((x, i) => new Tensor(addRows(x, m.subarray(i * hidden, (i + 1) * hidden)), [1, 1, hidden]));
}
