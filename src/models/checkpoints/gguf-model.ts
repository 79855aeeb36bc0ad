import { InvalidArgumentError } from '../../errors.ts';
import { GGUFReader } from '../../io/index.ts';
import { type PackedMatrix, Tensor } from '../../tensor/index.ts';
import { familyNamed, ggufReadArchs, ggufReader } from '../families/index.ts';
import { f32, hfTensorName, LLAMA3_ROPE_KEY, llama3RopeFactors, type Llama3Rope, permutedHeads, permuteRows, ropePermutation } from './gguf-names.ts';
import { tokenizerFromGGUF } from './gguf-tokenizer.ts';

/** Reading GGUF files of the architectures a family reads (its record's `gguf`) in Hugging Face's layout: see gguf-names.ts. */

type Json = Record<string, unknown>;

/** The shortest decimal that is the same float32 (a GGUF's float32 1e-6 is 9.99999997e-7, config.json's is 1e-6). */
function shortest(x: number): number {
  if (x !== f32(x)) return x;
  for (let p = 1; p < 17; p++) {
    const d = Number(x.toPrecision(p));
    if (f32(d) === x) return d;
  }
  return x;
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
    candidates.push({ factor, low: 1, high: Number(high.toPrecision(6)), original: Math.round(original) });
    candidates.push({ factor, low: 1, high, original });
  }
  const found = candidates.find(within(0)) ?? candidates.find(within(1e-5));
  if (!found) throw new InvalidArgumentError(`${where}: rope_freqs.weight holds factors that no Llama 3 rope scaling gives`);
  return { rope_type: 'llama3', factor, low_freq_factor: found.low, high_freq_factor: found.high, original_max_position_embeddings: found.original };
}

/** The Llama 3 rope parameters our export wrote beside rope_freqs, when they give exactly its factors; else null. */
function llama3Written(r: GGUFReader, factors: Float32Array, theta: number, headDim: number): Json | null {
  const written = r.get(LLAMA3_ROPE_KEY);
  if (typeof written !== 'string') return null;
  let s: Llama3Rope;
  try {
    s = JSON.parse(written) as Llama3Rope;
  } catch {
    return null;
  }
  const mine = llama3RopeFactors(theta, headDim, s);
  if (mine.length !== factors.length || mine.some((v, i) => v !== factors[i])) return null;
  return { rope_type: 'llama3', factor: s.factor, low_freq_factor: s.low, high_freq_factor: s.high, original_max_position_embeddings: s.original };
}

/** A GGUF file of a shared-decoder family, read lazily with Hugging Face's names and layout. Close it when done. */
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
      if (!ggufReader(arch)) {
        throw new InvalidArgumentError(`${path}: architecture '${arch}' is not supported from GGUF (${ggufReadArchs().join(', ')})`);
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

  /** The tokenizer as a tokenizer.json, whether llama.cpp adds a BOS, and its tokenizer_config.json (null: the file has none). */
  tokenizer(): { json: Json; addBos: boolean; config: Json } | null {
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
    if (!ggufReader(this.arch)?.gguf.permuted) return null;
    const heads = permutedHeads(name, Number(this.config.num_attention_heads), Number(this.config.num_key_value_heads));
    return heads === 0 ? null : ropePermutation(rows, heads, true);
  }

  /** A weight as a float32 Tensor in Hugging Face's layout (dequantized; permuted q/k rows put back in order). */
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
  const family = ggufReader(arch)!;
  const config: Json = {
    architectures: [family.architecture],
    model_type: family.name,
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
    attention_bias: r.has('blk.0.attn_q.bias') && family.gguf.qkvBiasBuiltIn !== true,
    torch_dtype: 'float32',
  };
  if (r.has('blk.0.ffn_gate.bias')) config.mlp_bias = true;
  // a sliding window: on llama's architecture it is Mistral's (which llama.cpp writes as llama); elsewhere none we read
  const window = r.get(`${arch}.attention.sliding_window`);
  if (window !== undefined) {
    const mistral = familyNamed('mistral');
    if (arch !== 'llama' || !mistral || typeof window !== 'number') {
      throw new InvalidArgumentError(`${where}: a sliding window ('${arch}.attention.sliding_window') on ${arch} is not supported`);
    }
    config.architectures = [mistral.architecture];
    config.model_type = mistral.name;
    config.sliding_window = window;
  }
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
    const factors = r.readFloat32('rope_freqs.weight');
    config.rope_scaling = llama3Written(r, factors, theta, headDim) ?? llama3FromFactors(factors, theta, headDim, where);
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

export { type GGUFFileType, hfToGGUF, type HFToGGUFOptions } from './gguf-export.ts';
export { ggufTensorName, hfTensorName, type Llama3Rope, llama3RopeFactors, permuteRows, ropePermutation } from './gguf-names.ts';
export { TOKEN_TYPE, tokenizerFromGGUF, tokenizerToGGUF } from './gguf-tokenizer.ts';
