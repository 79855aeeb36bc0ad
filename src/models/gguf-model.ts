import { InvalidArgumentError } from '../errors.ts';
import {
  GGUFMeta,
  type GGUFPlannedTensor,
  GGUFReader,
  type GGUFTensorData,
  type GGUFValue,
  GGUFWriter,
  type GGUFWriteType,
} from '../io/gguf.ts';
import { type PackedMatrix, Tensor } from '../tensor/index.ts';
import { tokenizerFromGGUF, tokenizerToGGUF } from './gguf-tokenizer.ts';

/**
 * The Llama-style families in GGUF (llama.cpp's architectures `llama`, which Mistral is too, `qwen2` and `qwen3`)
 * to and from Hugging Face's layout: config.json, tensor names, and the rotary permutation.
 *
 * llama.cpp's convert_hf_to_gguf.py permutes the rows of q_proj and k_proj (weights and biases) for the `llama`
 * architecture only (LlamaModel.permute, `undo_permute = True`): each head's two rotary halves become interleaved
 * pairs, because llama.cpp's `llama` rotates adjacent pairs (rope type NORM) where transformers rotates halves.
 * Qwen2 and Qwen3 (rope type NEOX, halves as transformers) are written as they are. Reading undoes the permutation,
 * writing applies it; it moves whole rows, so a Q8_0 or Q4_0 tensor stays exact.
 *
 * Not covered: Gemma (its norms are stored as 1 + w, and its sliding pattern, soft-caps and SentencePiece vocabulary
 * need their own mapping), MoE, Phi-3; sliding windows (llama.cpp's `llama` and `qwen2` run none, and a GGUF carries
 * none for them).
 */

type Json = Record<string, unknown>;

/** The GGUF architectures read, the model_type each becomes, and whether q/k rows are permuted. */
const ARCHS: Record<string, { modelType: string; architecture: string; permuted: boolean }> = {
  llama: { modelType: 'llama', architecture: 'LlamaForCausalLM', permuted: true },
  qwen2: { modelType: 'qwen2', architecture: 'Qwen2ForCausalLM', permuted: false },
  qwen3: { modelType: 'qwen3', architecture: 'Qwen3ForCausalLM', permuted: false },
};
/** The GGUF architecture of each Hugging Face model_type written (convert_hf_to_gguf.py: Mistral is LlamaModel). */
const GGUF_ARCH: Record<string, string> = { llama: 'llama', mistral: 'llama', qwen2: 'qwen2', qwen3: 'qwen3' };

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
function permutedHeads(hfName: string, heads: number, kvHeads: number): number {
  if (/\.self_attn\.q_proj\.(weight|bias)$/.test(hfName)) return heads;
  if (/\.self_attn\.k_proj\.(weight|bias)$/.test(hfName)) return kvHeads;
  return 0;
}

const f32 = Math.fround;

/** The shortest decimal that is the same float32 (a GGUF's float32 1e-6 is 9.99999997e-7, config.json's is 1e-6). */
function shortest(x: number): number {
  if (x !== f32(x)) return x;
  for (let p = 1; p < 17; p++) {
    const d = Number(x.toPrecision(p));
    if (f32(d) === x) return d;
  }
  return x;
}

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

/**
 * Llama 3's rope_scaling from the factors a GGUF stores in `rope_freqs.weight` (the file keeps no parameters): Llama
 * 3.1's low 1, high 4 and 8192 positions if they give these factors, else a fit of the smooth ones (any parameters
 * that give the same factors give the same rotary). Throws when none fits.
 */
function llama3FromFactors(factors: Float32Array, theta: number, headDim: number, where: string): Json {
  const factor = factors[factors.length - 1];
  const within = (tolerance: number) => (s: Llama3Rope) =>
    llama3RopeFactors(theta, headDim, s).every((v, i) => Math.abs(v - factors[i]) <= tolerance * Math.abs(factors[i]));
  const candidates = [{ factor, low: 1, high: 4, original: 8192 }];
  const wavelen = (i: number) => (2 * Math.PI) / f32(1 / f32(theta ** f32((2 * i) / headDim)));
  const smooth = [...factors.keys()].filter((i) => factors[i] > 1 + 1e-6 && factors[i] < factor * (1 - 1e-6));
  if (smooth.length >= 2) {
    const [a, b] = [smooth[0], smooth[smooth.length - 1]];
    const s = (i: number) => (1 / factors[i] - 1 / factor) / (1 - 1 / factor);
    const slope = (s(b) - s(a)) / (1 / wavelen(b) - 1 / wavelen(a));
    const intercept = s(a) - slope / wavelen(a);
    const [high, original] = [1 - 1 / intercept, -slope / intercept];
    // the parameters a config.json would hold: whole positions and a short high factor, then the fit as it is
    candidates.push({ factor, low: 1, high: Number(high.toPrecision(6)), original: Math.round(original) }, { factor, low: 1, high, original });
  }
  const found = candidates.find(within(0)) ?? candidates.find(within(1e-5));
  if (!found) throw new InvalidArgumentError(`${where}: rope_freqs.weight holds factors that no Llama 3 rope scaling gives`);
  return { rope_type: 'llama3', factor, low_freq_factor: found.low, high_freq_factor: found.high, original_max_position_embeddings: found.original };
}

/** A GGUF file of a Llama-style family, read lazily with Hugging Face's names and layout. Close it when done. */
export class GGUFModel {
  private constructor(
    readonly reader: GGUFReader,
    /** general.architecture. */
    readonly arch: string,
    /** The config.json that Hugging Face transformers (and our configFromHF) reads for this model. */
    readonly config: Json,
    /** Hugging Face name → GGUF name, in the file's order. */
    private readonly names: Map<string, string>,
  ) {}

  /**
   * @example
   * const m = GGUFModel.open('tiny.gguf')
   * const model = createModel(configFromHF(m.config), { init: false })
   * for (const w of m.weights()) target(w.name).data.set(m.read(w.name).data)
   * m.close()
   */
  static open(path: string): GGUFModel {
    const reader = GGUFReader.open(path);
    try {
      const arch = String(reader.get('general.architecture'));
      if (!Object.hasOwn(ARCHS, arch)) {
        throw new InvalidArgumentError(`${path}: architecture '${arch}' is not supported from GGUF (${Object.keys(ARCHS).join(', ')})`);
      }
      const names = new Map<string, string>();
      for (const t of reader.tensors()) {
        if (t.name === 'rope_freqs.weight') continue; // read into the config
        const hf = hfTensorName(t.name);
        if (hf === null) throw new InvalidArgumentError(`${path}: tensor '${t.name}' has no Hugging Face name for architecture '${arch}'`);
        names.set(hf, t.name);
      }
      return new GGUFModel(reader, arch, hfConfig(reader, arch), names);
    } catch (err) {
      reader.close();
      throw err;
    }
  }

  /** The tokenizer as a tokenizer.json, and whether llama.cpp adds a BOS (null: the file has none). */
  tokenizer(): { json: Json; addBos: boolean } | null {
    return tokenizerFromGGUF(this.reader);
  }

  /** Every weight: its Hugging Face name, PyTorch shape and GGUF type. */
  weights(): { name: string; shape: number[]; type: string }[] {
    return [...this.names].map(([name, g]) => {
      const info = this.reader.info(g);
      return { name, shape: info.shape, type: typeof info.type === 'string' ? info.type : info.type.unsupported };
    });
  }

  private ggufName(name: string): string {
    const g = this.names.get(name);
    if (g === undefined) throw new InvalidArgumentError(`${this.reader.path}: no weight named '${name}'`);
    return g;
  }

  private order(name: string, rows: number): Int32Array | null {
    if (!ARCHS[this.arch].permuted) return null;
    const heads = permutedHeads(name, Number(this.config.num_attention_heads), Number(this.config.num_key_value_heads));
    return heads === 0 ? null : ropePermutation(rows, heads, true);
  }

  /** A weight as a float32 Tensor in Hugging Face's layout (dequantized; q/k rows of `llama` put back in order). */
  read(name: string): Tensor {
    const g = this.ggufName(name);
    const info = this.reader.info(g);
    const values = this.reader.readFloat32(g);
    const order = this.order(name, info.shape[0]);
    return new Tensor(order ? permuteRows(values, order) : values, info.shape);
  }

  /** A Q8_0, Q4_0 or BF16 matrix as our int8, int4 or bf16 PackedMatrix exactly, in Hugging Face's layout; else null. */
  readPacked(name: string): PackedMatrix | null {
    const g = this.ggufName(name);
    if (this.reader.info(g).shape.length !== 2) return null;
    const p = this.reader.readPacked(g);
    const order = p && this.order(name, p.rows);
    return p && order ? permuteRows(p, order) : p;
  }

  close(): void {
    this.reader.close();
  }
}

/** config.json of a GGUF file of architecture `arch`, from `<arch>.*` metadata (and the token list for the vocabulary). */
function hfConfig(r: GGUFReader, arch: string): Json {
  const where = r.path;
  const num = (key: string, fallback?: number): number => {
    const v = r.get(`${arch}.${key}`);
    if (v === undefined) {
      if (fallback === undefined) throw new InvalidArgumentError(`${where}: metadata lacks '${arch}.${key}'`);
      return fallback;
    }
    const values = (Array.isArray(v) ? v : [v]).map((x) => (typeof x === 'number' ? shortest(x) : Number(x)));
    if (values.some((x) => x !== values[0] || Number.isNaN(x))) throw new InvalidArgumentError(`${where}: '${arch}.${key}' differs between blocks, which is not supported`);
    return values[0];
  };
  const hidden = num('embedding_length');
  const heads = num('attention.head_count');
  const headDim = num('attention.key_length', hidden / heads);
  if (num('attention.value_length', headDim) !== headDim) throw new InvalidArgumentError(`${where}: keys and values of different sizes are not supported`);
  if (num('rope.dimension_count', headDim) !== headDim) throw new InvalidArgumentError(`${where}: a rotary over part of each head is not supported`);
  const tokens = r.get('tokenizer.ggml.tokens');
  const embd = r.has('token_embd.weight') ? r.info('token_embd.weight').shape[0] : undefined;
  const vocab = Array.isArray(tokens) ? tokens.length : num('vocab_size', embd);
  const theta = num('rope.freq_base', 10000);
  const config: Json = {
    architectures: [ARCHS[arch].architecture],
    model_type: ARCHS[arch].modelType,
    vocab_size: vocab,
    max_position_embeddings: num('context_length'),
    hidden_size: hidden,
    intermediate_size: num('feed_forward_length'),
    num_hidden_layers: num('block_count'),
    num_attention_heads: heads,
    num_key_value_heads: num('attention.head_count_kv', heads),
    head_dim: headDim,
    hidden_act: 'silu',
    rms_norm_eps: num('attention.layer_norm_rms_epsilon', 1e-6),
    rope_theta: theta,
    tie_word_embeddings: !r.has('output.weight'),
    attention_bias: r.has('blk.0.attn_q.bias') && arch !== 'qwen2',
    torch_dtype: 'float32',
  };
  if (r.has('blk.0.ffn_gate.bias')) config.mlp_bias = true;
  const bos = r.get('tokenizer.ggml.bos_token_id');
  const eos = r.get('tokenizer.ggml.eos_token_id');
  if (bos !== undefined) config.bos_token_id = Number(bos);
  if (eos !== undefined) config.eos_token_id = Number(eos);
  const scaling = r.get(`${arch}.rope.scaling.type`);
  const factor = r.get(`${arch}.rope.scaling.factor`);
  if (scaling === 'linear') config.rope_scaling = { rope_type: 'linear', factor: shortest(Number(factor)) };
  else if (scaling === 'yarn') {
    const yarn: Json = { rope_type: 'yarn', factor: shortest(Number(factor)), original_max_position_embeddings: num('rope.scaling.original_context_length') };
    for (const [key, hf] of [['yarn_beta_fast', 'beta_fast'], ['yarn_beta_slow', 'beta_slow'], ['yarn_attn_factor', 'attention_factor']]) {
      const v = r.get(`${arch}.rope.scaling.${key}`);
      if (v !== undefined) yarn[hf] = shortest(Number(v));
    }
    config.rope_scaling = yarn;
  } else if (scaling !== undefined && scaling !== 'none') {
    throw new InvalidArgumentError(`${where}: rope scaling '${String(scaling)}' is not supported (linear, yarn, and Llama 3's rope_freqs)`);
  }
  if (r.has('rope_freqs.weight')) {
    if (config.rope_scaling) throw new InvalidArgumentError(`${where}: rope_freqs.weight beside rope scaling '${String(scaling)}' is not supported`);
    config.rope_scaling = llama3FromFactors(r.readFloat32('rope_freqs.weight'), theta, headDim, where);
  }
  return config;
}

/**
 * A GGUF file as Hugging Face would hold it: config.json, tokenizer.json (null when the file has none) and its weights
 * as float32 tensors under Hugging Face's names, read one at a time as the iteration asks; the file closes when the
 * iteration ends.
 * @example
 * const { config, tensors } = ggufToHF('tiny.gguf')
 * for (const [name, t] of tensors) state.get(name)!.data.set(t.data)
 */
export function ggufToHF(path: string): { config: Json; tokenizer: Json | null; addBos: boolean; tensors: Generator<[string, Tensor]> } {
  const model = GGUFModel.open(path);
  let tok: { json: Json; addBos: boolean } | null;
  try {
    tok = model.tokenizer();
  } catch (err) {
    model.close();
    throw err;
  }
  function* tensors(): Generator<[string, Tensor]> {
    try {
      for (const w of model.weights()) yield [w.name, model.read(w.name)];
    } finally {
      model.close();
    }
  }
  return { config: model.config, tokenizer: tok?.json ?? null, addBos: tok?.addBos ?? false, tensors: tensors() };
}

/** The types of `tensorlink convert --type`. */
export type GGUFFileType = 'f32' | 'f16' | 'bf16' | 'q8_0' | 'q4_0';

/** llama_ftype's ids (general.file_type). */
const FILE_TYPE_IDS: Record<GGUFFileType, number> = { f32: 0, f16: 1, q4_0: 2, q8_0: 7, bf16: 32 };

export interface HFToGGUFOptions {
  /** The model's config.json (configToHF of our config). */
  config: Json;
  /** Its tokenizer.json (Tokenizer.toJSON()), or null to write none. */
  tokenizer: Json | null;
  /**
   * The weights in the order to write them, with Hugging Face names and shapes; `format` is the PackedMatrix
   * format `read` will give for that weight (absent: float32). A tied lm_head is left out.
   */
  weights: { name: string; shape: number[]; format?: 'bf16' | 'int8' | 'int4' }[];
  /** Each weight's data when its turn comes: float32 values, a Tensor, or a PackedMatrix. */
  read: (name: string) => GGUFTensorData | Promise<GGUFTensorData>;
  /**
   * The type of every matrix (default: float32 matrices as F32, packed ones in their own type: int8 → Q8_0,
   * int4 → Q4_0, bf16 → BF16, exactly). Vectors (norms, biases) are always F32; a matrix whose rows are not a
   * multiple of 32 long falls back to F16 for q8_0 and q4_0.
   */
  type?: GGUFFileType;
  /** general.name. */
  name?: string;
}

const WRITE_TYPE: Record<GGUFFileType, GGUFWriteType> = { f32: 'F32', f16: 'F16', bf16: 'BF16', q8_0: 'Q8_0', q4_0: 'Q4_0' };
const FORMAT_TYPE = { int8: 'Q8_0', int4: 'Q4_0', bf16: 'BF16' } as const;

/** A config.json number, or a clear error. */
function field(config: Json, key: string, fallback?: number): number {
  const v = config[key] ?? fallback;
  if (typeof v !== 'number') throw new InvalidArgumentError(`config.json '${key}' must be a number to write GGUF`);
  return v;
}

/** The GGUF metadata of a Llama-style config.json (and the rope_freqs of Llama 3's scaling, if any). */
function ggufMetadata(
  config: Json,
  arch: string,
  fileType: number,
  name: string,
): { metadata: Record<string, GGUFValue>; ropeFreqs: Float32Array | null } {
  const hidden = field(config, 'hidden_size');
  const heads = field(config, 'num_attention_heads');
  const headDim = field(config, 'head_dim', hidden / heads);
  const theta = field(config, 'rope_theta', 10000);
  if (config.partial_rotary_factor !== undefined && config.partial_rotary_factor !== null && config.partial_rotary_factor !== 1) {
    throw new InvalidArgumentError('a partial rotary cannot be written to GGUF for these architectures');
  }
  const m: Record<string, GGUFValue> = {
    'general.architecture': GGUFMeta.str(arch),
    'general.name': GGUFMeta.str(name),
    'general.file_type': GGUFMeta.u32(fileType),
    [`${arch}.vocab_size`]: GGUFMeta.u32(field(config, 'vocab_size')),
    [`${arch}.context_length`]: GGUFMeta.u32(field(config, 'max_position_embeddings')),
    [`${arch}.embedding_length`]: GGUFMeta.u32(hidden),
    [`${arch}.block_count`]: GGUFMeta.u32(field(config, 'num_hidden_layers')),
    [`${arch}.feed_forward_length`]: GGUFMeta.u32(field(config, 'intermediate_size')),
    [`${arch}.attention.head_count`]: GGUFMeta.u32(heads),
    [`${arch}.attention.head_count_kv`]: GGUFMeta.u32(field(config, 'num_key_value_heads', heads)),
    [`${arch}.attention.key_length`]: GGUFMeta.u32(headDim),
    [`${arch}.attention.value_length`]: GGUFMeta.u32(headDim),
    [`${arch}.rope.dimension_count`]: GGUFMeta.u32(headDim),
    [`${arch}.rope.freq_base`]: GGUFMeta.f32(theta),
    [`${arch}.attention.layer_norm_rms_epsilon`]: GGUFMeta.f32(field(config, 'rms_norm_eps', 1e-6)),
  };
  const rope = (config.rope_scaling ?? null) as Json | null;
  const type = rope && String(rope.rope_type ?? rope.type ?? 'default');
  let ropeFreqs: Float32Array | null = null;
  if (rope && type === 'linear') {
    m[`${arch}.rope.scaling.type`] = GGUFMeta.str('linear');
    m[`${arch}.rope.scaling.factor`] = GGUFMeta.f32(field(rope, 'factor'));
  } else if (rope && type === 'yarn') {
    m[`${arch}.rope.scaling.type`] = GGUFMeta.str('yarn');
    m[`${arch}.rope.scaling.factor`] = GGUFMeta.f32(field(rope, 'factor'));
    m[`${arch}.rope.scaling.original_context_length`] = GGUFMeta.u32(field(rope, 'original_max_position_embeddings', field(config, 'max_position_embeddings')));
    for (const [hf, key] of [['beta_fast', 'yarn_beta_fast'], ['beta_slow', 'yarn_beta_slow'], ['attention_factor', 'yarn_attn_factor']]) {
      if (typeof rope[hf] === 'number') m[`${arch}.rope.scaling.${key}`] = GGUFMeta.f32(rope[hf]);
    }
  } else if (rope && type === 'llama3') {
    const original = field(rope, 'original_max_position_embeddings', field(config, 'max_position_embeddings'));
    ropeFreqs = llama3RopeFactors(theta, headDim, { factor: field(rope, 'factor'), low: field(rope, 'low_freq_factor'), high: field(rope, 'high_freq_factor'), original });
  } else if (rope && type !== 'default') {
    throw new InvalidArgumentError(`rope scaling '${type}' cannot be written to GGUF (linear, yarn, llama3)`);
  }
  return { metadata: m, ropeFreqs };
}

/**
 * Writes a Llama-style model (model_type llama, mistral, qwen2 or qwen3) as a GGUF file that llama.cpp loads: its
 * metadata, its tokenizer (byte-level BPE: see gguf-tokenizer.ts), and its weights under GGUF's names, q/k rows
 * permuted for the `llama` architecture, each read when its turn comes (only that weight is held).
 * @example
 * await hfToGGUF('tiny.gguf', { config: configToHF(model.config), tokenizer: model.tokenizer?.toJSON() ?? null,
 *   weights: [...model.hfStateDict()].map(([name, t]) => ({ name, shape: [...t.shape] })),
 *   read: (name) => model.hfStateDict().get(name)!, type: 'q4_0' })
 */
export async function hfToGGUF(path: string, options: HFToGGUFOptions): Promise<void> {
  const { config } = options;
  const modelType = String(config.model_type);
  const arch = GGUF_ARCH[modelType];
  if (arch === undefined) throw new InvalidArgumentError(`model_type '${modelType}' cannot be written to GGUF (${Object.keys(GGUF_ARCH).join(', ')})`);
  const tied = config.tie_word_embeddings === true;
  const weights = options.weights.filter((w) => !(tied && w.name === 'lm_head.weight'));
  const typeOf = (w: HFToGGUFOptions['weights'][number]): GGUFWriteType => {
    if (w.shape.length < 2) return 'F32';
    const wanted = options.type ? WRITE_TYPE[options.type] : w.format ? FORMAT_TYPE[w.format] : 'F32';
    return (wanted === 'Q8_0' || wanted === 'Q4_0') && w.shape[w.shape.length - 1] % 32 !== 0 ? 'F16' : wanted;
  };
  const planned: GGUFPlannedTensor[] = weights.map((w) => {
    const g = ggufTensorName(w.name);
    if (g === null) throw new InvalidArgumentError(`weight '${w.name}' has no GGUF name for architecture '${arch}'`);
    return { name: g, shape: [...w.shape], type: typeOf(w) };
  });
  const formats = weights.map((w) => w.format);
  const fileType = options.type ?? (formats.includes('int4') ? 'q4_0' : formats.includes('int8') ? 'q8_0' : formats.includes('bf16') ? 'bf16' : 'f32');
  const { metadata, ropeFreqs } = ggufMetadata(config, arch, FILE_TYPE_IDS[fileType], options.name ?? modelType);
  if (options.tokenizer) {
    const ids = { bos: config.bos_token_id as number | undefined, eos: config.eos_token_id as number | undefined };
    Object.assign(metadata, tokenizerToGGUF(options.tokenizer, field(config, 'vocab_size'), ids));
  }
  if (ropeFreqs) planned.unshift({ name: 'rope_freqs.weight', shape: [ropeFreqs.length], type: 'F32' });
  const heads = field(config, 'num_attention_heads');
  const kvHeads = field(config, 'num_key_value_heads', heads);
  const writer = GGUFWriter.create(path, metadata, planned);
  try {
    if (ropeFreqs) writer.write('rope_freqs.weight', ropeFreqs);
    for (const [i, w] of weights.entries()) {
      let data = await options.read(w.name);
      const h = arch === 'llama' ? permutedHeads(w.name, heads, kvHeads) : 0;
      if (h > 0) {
        if (data instanceof Tensor) data = data.packed ?? (data.data as Float32Array);
        const values = isPackedMatrix(data) ? data : data instanceof Float32Array ? data : Float32Array.from(data as ArrayLike<number>);
        data = permuteRows(values, ropePermutation(w.shape[0], h));
      }
      writer.write(planned[ropeFreqs ? i + 1 : i].name, data);
    }
    writer.close();
  } finally {
    writer.abandon();
  }
}

function isPackedMatrix(d: GGUFTensorData): d is PackedMatrix {
  return typeof (d as PackedMatrix).format === 'string' && (d as PackedMatrix).scales instanceof Float32Array;
}
