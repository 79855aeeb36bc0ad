import { InvalidArgumentError } from '../../errors.ts';
import type { PackedMatrix } from '../../tensor/index.ts';

/**
 * The shared decoder's families in GGUF (the records with a `gguf` field say which: their llama.cpp architecture,
 * whether it is read back, whether its q/k rows are permuted) to and from Hugging Face's layout: here the tensor
 * names, the rotary permutation and the llama3 rope scaling's factors; reading in gguf-model.ts, writing in
 * gguf-export.ts, the tokenizer in gguf-tokenizer.ts.
 *
 * llama.cpp's convert_hf_to_gguf.py permutes the rows of q_proj and k_proj (weights and biases) for the
 * architectures whose rope type is NORM (LlamaModel.permute, `undo_permute = True`): each head's two rotary halves
 * become interleaved pairs, because such an architecture rotates adjacent pairs where transformers rotates halves.
 * Those of rope type NEOX (halves as transformers) are written as they are. Reading undoes the permutation, writing
 * applies it; it moves whole rows, so a Q8_0 or Q4_0 tensor stays exact.
 *
 * Not covered: the families without a `gguf` field (norms stored as 1 + w, sliding patterns, soft-caps, experts,
 * fused projections need their own mapping); sliding windows (a GGUF carries none for these architectures).
 */

/** Per-block tensors: GGUF's name after `blk.N.`, Hugging Face's after `model.layers.N.`. */
const BLOCK_NAMES: [string, string][] = [
  ['attn_norm', 'input_layernorm'],
  ['ffn_norm', 'post_attention_layernorm'],
  ['attn_q', 'self_attn.q_proj'],
  ['attn_k', 'self_attn.k_proj'],
  ['attn_v', 'self_attn.v_proj'],
  ['attn_output', 'self_attn.o_proj'],
  ['attn_q_norm', 'self_attn.q_norm'],
  ['attn_k_norm', 'self_attn.k_norm'],
  ['ffn_gate', 'mlp.gate_proj'],
  ['ffn_up', 'mlp.up_proj'],
  ['ffn_down', 'mlp.down_proj'],
];
const TOP_NAMES: [string, string][] = [['token_embd', 'model.embed_tokens'], ['output_norm', 'model.norm'], ['output', 'lm_head']];

/** The Hugging Face name of a GGUF tensor (`blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`), or null. */
export function hfTensorName(name: string): string | null {
  const m = /^(.*)\.(weight|bias)$/.exec(name);
  if (!m) return null;
  const top = TOP_NAMES.find(([g]) => g === m[1]);
  if (top) return `${top[1]}.${m[2]}`;
  const b = /^blk\.(\d+)\.(\w+)$/.exec(m[1]);
  const part = b && BLOCK_NAMES.find(([g]) => g === b[2]);
  return part ? `model.layers.${b[1]}.${part[1]}.${m[2]}` : null;
}

/** The GGUF name of a Hugging Face tensor (the reverse of hfTensorName), or null. */
export function ggufTensorName(name: string): string | null {
  const m = /^(.*)\.(weight|bias)$/.exec(name);
  if (!m) return null;
  const top = TOP_NAMES.find(([, h]) => h === m[1]);
  if (top) return `${top[0]}.${m[2]}`;
  const b = /^model\.layers\.(\d+)\.(.+)$/.exec(m[1]);
  const part = b && BLOCK_NAMES.find(([, h]) => h === b[2]);
  return part ? `blk.${b[1]}.${part[0]}.${m[2]}` : null;
}

/**
 * The row order of LlamaModel.permute over `rows` rows in `heads` heads: row i of the result is row order[i] of the
 * input. Forward (Hugging Face → GGUF): each head's [2, hd/2] rows become [hd/2, 2]; `inverse` undoes it.
 */
export function ropePermutation(rows: number, heads: number, inverse = false): Int32Array {
  const hd = rows / heads;
  if (!Number.isInteger(hd) || hd % 2 !== 0) throw new InvalidArgumentError(`${rows} rows do not split into ${heads} heads of an even size`);
  const order = new Int32Array(rows);
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < hd / 2; i++) {
      for (let s = 0; s < 2; s++) {
        const gguf = h * hd + 2 * i + s;
        const hf = h * hd + s * (hd / 2) + i;
        if (inverse) order[hf] = gguf;
        else order[gguf] = hf;
      }
    }
  }
  return order;
}

/** Rows of a matrix (or the entries of a vector: cols 1) taken in `order`; a packed matrix moves whole rows of blocks. */
export function permuteRows<T extends Float32Array | PackedMatrix>(data: T, order: Int32Array): T {
  if (data instanceof Float32Array) {
    const cols = data.length / order.length;
    const out = new Float32Array(data.length);
    order.forEach((from, i) => out.set(data.subarray(from * cols, (from + 1) * cols), i * cols));
    return out as T;
  }
  const p = data as PackedMatrix;
  if (p.rows !== order.length) throw new InvalidArgumentError(`a permutation of ${order.length} rows cannot apply to ${p.rows}`);
  const rowData = p.data.length / p.rows;
  const rowScales = p.scales.length / p.rows;
  const out = { ...p, data: new (p.data.constructor as Uint8ArrayConstructor)(p.data.length), scales: new Float32Array(p.scales.length) };
  order.forEach((from, i) => {
    out.data.set(p.data.subarray(from * rowData, (from + 1) * rowData), i * rowData);
    out.scales.set(p.scales.subarray(from * rowScales, (from + 1) * rowScales), i * rowScales);
  });
  return out as T;
}

/** The heads whose rows a q_proj or k_proj tensor of a permuted architecture holds, or 0 for any other tensor. */
export function permutedHeads(hfName: string, heads: number, kvHeads: number): number {
  if (/\.self_attn\.q_proj\.(weight|bias)$/.test(hfName)) return heads;
  if (/\.self_attn\.k_proj\.(weight|bias)$/.test(hfName)) return kvHeads;
  return 0;
}

export const f32 = Math.fround;

/** Metadata key under which our export keeps Llama 3's rope parameters beside rope_freqs (a JSON Llama3Rope). */
export const LLAMA3_ROPE_KEY = 'tensorlink.rope_scaling.llama3';

export interface Llama3Rope {
  factor: number;
  low: number;
  high: number;
  original: number;
}

/** convert_hf_to_gguf.py's rope_freqs for Llama 3's rope scaling (one factor per rotary pair), in float32. */
export function llama3RopeFactors(theta: number, headDim: number, s: Llama3Rope): Float32Array {
  const lowWavelen = s.original / s.low;
  const highWavelen = s.original / s.high;
  return Float32Array.from({ length: headDim / 2 }, (_, i) => {
    const wavelen = (2 * Math.PI) / f32(1 / f32(theta ** f32((2 * i) / headDim)));
    if (wavelen < highWavelen) return 1;
    if (wavelen > lowWavelen) return s.factor;
    const smooth = (s.original / wavelen - s.low) / (s.high - s.low);
    return 1 / ((1 - smooth) / s.factor + smooth);
  });
}
