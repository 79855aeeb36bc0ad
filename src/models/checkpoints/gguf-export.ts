import { InvalidArgumentError } from '../../errors.ts';
import { GGUFMeta, type GGUFPlannedTensor, type GGUFTensorData, type GGUFValue, GGUFWriter, type GGUFWriteType } from '../../io/index.ts';
import { type PackedMatrix, Tensor } from '../../tensor/index.ts';
import { familyNamed, ggufWritten } from '../families/index.ts';
import { ggufTensorName, LLAMA3_ROPE_KEY, llama3RopeFactors, permutedHeads, permuteRows, ropePermutation } from './gguf-names.ts';
import { tokenizerToGGUF } from './gguf-tokenizer.ts';

/** Writing the families with a GGUF architecture (their records' `gguf`) as GGUF files that llama.cpp loads: see gguf-names.ts. */

type Json = Record<string, unknown>;

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

/** The GGUF metadata of a shared-decoder config.json (and the rope_freqs of a llama3 rope scaling, if any). */
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
  // a sliding window (Mistral's) travels as the key llama.cpp names it, and comes back as the family that has one
  const window = config.use_sliding_window === false ? null : config.sliding_window;
  if (typeof window === 'number') m[`${arch}.attention.sliding_window`] = GGUFMeta.u32(window);
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
    const llama3 = { factor: field(rope, 'factor'), low: field(rope, 'low_freq_factor'), high: field(rope, 'high_freq_factor'), original };
    ropeFreqs = llama3RopeFactors(theta, headDim, llama3);
    // llama.cpp reads the factors alone; the parameters that made them travel too, for a reader that wants them back
    m[LLAMA3_ROPE_KEY] = GGUFMeta.str(JSON.stringify(llama3));
  } else if (rope && type !== 'default') {
    throw new InvalidArgumentError(`rope scaling '${type}' cannot be written to GGUF (linear, yarn, llama3)`);
  }
  return { metadata: m, ropeFreqs };
}

/**
 * Writes a model of a family with a GGUF architecture (its record's `gguf`) as a GGUF file that llama.cpp loads: its
 * metadata, its tokenizer (byte-level BPE: see gguf-tokenizer.ts), and its weights under GGUF's names, q/k rows
 * permuted where the architecture's rope type asks, each read when its turn comes (only that weight is held).
 * @example
 * await hfToGGUF('tiny.gguf', { config: configToHF(model.config), tokenizer: model.tokenizer?.toJSON() ?? null,
 *   weights: [...model.hfStateDict()].map(([name, t]) => ({ name, shape: [...t.shape] })),
 *   read: (name) => model.hfStateDict().get(name)!, type: 'q4_0' })
 */
export async function hfToGGUF(path: string, options: HFToGGUFOptions): Promise<void> {
  const { config } = options;
  const modelType = String(config.model_type);
  const gguf = familyNamed(modelType)?.gguf;
  if (gguf === undefined) throw new InvalidArgumentError(`model_type '${modelType}' cannot be written to GGUF (${ggufWritten().join(', ')})`);
  const arch = gguf.arch;
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
      const h = gguf.permuted ? permutedHeads(w.name, heads, kvHeads) : 0;
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
