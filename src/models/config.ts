import { InvalidArgumentError } from '../errors.ts';
import { type BloomConfig, bloomFromHF, bloomToHF, validateBloom } from './bloom.ts';
import { type FalconConfig, falconFromHF, falconToHF, validateFalcon } from './falcon.ts';
import { type GemmaConfig, gemmaFromHF, gemmaToHF, isGemmaType, validateGemma } from './gemma.ts';
import { type GPTNeoXConfig, gptNeoXFromHF, gptNeoXToHF, validateGPTNeoX } from './gpt-neox.ts';
import { isLlamaFamily, llamaConfigFromHF, llamaConfigToHF, validateLlamaConfig } from './llama-config.ts';
import { type MixtralConfig, mixtralFromHF, mixtralToHF, validateMixtral } from './mixtral.ts';
import { type Qwen3MoeConfig, qwen3MoeFromHF, qwen3MoeToHF, validateQwen3Moe } from './qwen3-moe.ts';
import type { RopeScaling } from './rope.ts';

/** What the config of every family holds, in our names (each family's config.json key says which field it is read from). */
export interface DecoderConfigBase {
  vocabSize: number;
  /** Longest sequence the model's positions cover. */
  maxPositions: number;
  hidden: number;
  /** Blocks. */
  layers: number;
  /** Attention (query) heads. */
  heads: number;
  /** The MLP's width. */
  intermediate: number;
  /** The norms' epsilon. */
  normEps: number;
  /** Std of the initial weights. */
  initializerRange: number;
  /** The LM head shares the token embedding. */
  tieWordEmbeddings: boolean;
  bosTokenId?: number;
  eosTokenId?: number;
}

/** GPT-2 (Hugging Face `model_type: gpt2`). Defaults are GPT-2 small's: vocabulary 50257, 1024 positions, 768 wide, 12 blocks and heads. */
export interface GPT2Config extends DecoderConfigBase {
  arch: 'gpt2';
}

/** A block's attention in the families with sliding windows (transformers' layer_types). */
export type LlamaLayerType = 'full_attention' | 'sliding_attention';

/**
 * Llama (`model_type: llama`; Mistral, Qwen2, Qwen3 and Phi-3 configs reduce to it, see
 * llama-config.ts). Defaults are Llama-2-7B's shape.
 */
export interface LlamaConfig extends DecoderConfigBase {
  arch: 'llama';
  /** Key/value heads for grouped-query attention (= heads for multi-head attention). */
  kvHeads: number;
  /** Per-head size (hidden / heads unless the config says otherwise). */
  headDim: number;
  /** Rotary base (10000). */
  ropeTheta: number;
  /** Bias on q, k, v projections (Qwen2) and on o (Llama's attention_bias sets both). */
  qkvBias: boolean;
  oBias: boolean;
  /**
   * The Hugging Face model_type this came from (llama, mistral, qwen2, qwen3, phi3), kept for
   * saving; qwen3 adds q/k norms, phi3 fuses q/k/v and gate/up.
   */
  modelType: string;
  /** rope_scaling (linear, dynamic, yarn, llama3); absent: the plain rotary. */
  ropeScaling?: RopeScaling;
  /** Phi-3's partial_rotary_factor: the fraction of each head's dims that rotate (absent: all). */
  partialRotaryFactor?: number;
  /** Sliding window: a token attends to itself and the window − 1 before it (absent: no window). */
  slidingWindow?: number;
  /** Which blocks the window applies to (Qwen's layer_types; absent: every block, as Mistral). */
  layerTypes?: LlamaLayerType[];
  /** Biases on the MLP's projections (Llama's mlp_bias). */
  mlpBias?: boolean;
}

export type ModelConfig
  = GPT2Config | LlamaConfig | GPTNeoXConfig | FalconConfig | BloomConfig | GemmaConfig | MixtralConfig | Qwen3MoeConfig;

export function gpt2Config(overrides: Partial<Omit<GPT2Config, 'arch'>> = {}): GPT2Config {
  const hidden = overrides.hidden ?? 768;
  return {
    arch: 'gpt2',
    vocabSize: 50257,
    maxPositions: 1024,
    layers: 12,
    heads: 12,
    normEps: 1e-5,
    initializerRange: 0.02,
    tieWordEmbeddings: true,
    bosTokenId: 50256,
    eosTokenId: 50256,
    ...overrides,
    hidden,
    intermediate: overrides.intermediate ?? 4 * hidden,
  };
}

export function llamaConfig(overrides: Partial<Omit<LlamaConfig, 'arch'>> = {}): LlamaConfig {
  const hidden = overrides.hidden ?? 4096;
  const heads = overrides.heads ?? 32;
  return {
    arch: 'llama',
    vocabSize: 32000,
    maxPositions: 4096,
    layers: 32,
    intermediate: 11008,
    normEps: 1e-6,
    ropeTheta: 10000,
    initializerRange: 0.02,
    tieWordEmbeddings: false,
    qkvBias: false,
    oBias: false,
    modelType: 'llama',
    bosTokenId: 1,
    eosTokenId: 2,
    ...overrides,
    hidden,
    heads,
    kvHeads: overrides.kvHeads ?? heads,
    headDim: overrides.headDim ?? hidden / heads,
  };
}

/** Checks the dimensions fit together; throws InvalidArgumentError naming the field. */
/**
 * The largest config values accepted, each far beyond any open model and each with its reason:
 * a config also arrives from peers (a worker builds the section a user names), and one absurd
 * number must not make it allocate without bound or compute sizes that overflow.
 */
export const CONFIG_LIMITS = {
  /** Tokenizers of open models have up to ~256k entries. */
  vocabSize: 4_194_304,
  /** Contexts of open models reach 128k–1M positions. */
  maxPositions: 4_194_304,
  /** The widest open models are ~16k–25k wide. */
  hidden: 262_144,
  /** Open models have at most a few hundred blocks. */
  layers: 4_096,
  heads: 16_384,
  intermediate: 1_048_576,
} as const;

export function validateConfig(c: ModelConfig): ModelConfig {
  for (const k of Object.keys(CONFIG_LIMITS) as (keyof typeof CONFIG_LIMITS)[]) {
    if (!Number.isInteger(c[k]) || c[k] <= 0) throw new InvalidArgumentError(`config ${k} must be a positive integer, got ${c[k]}`);
    if (c[k] > CONFIG_LIMITS[k]) throw new InvalidArgumentError(`config ${k} is ${c[k]}, more than the ${CONFIG_LIMITS[k]} any model here may have`);
  }
  if (c.arch === 'gpt_neox') validateGPTNeoX(c);
  if (c.arch === 'falcon') validateFalcon(c);
  if (c.arch === 'bloom') validateBloom(c);
  if (c.arch === 'gemma') validateGemma(c);
  if (c.arch === 'mixtral') validateMixtral(c);
  if (c.arch === 'qwen3_moe') validateQwen3Moe(c);
  if (c.arch === 'gpt2' && c.hidden % c.heads !== 0) {
    throw new InvalidArgumentError(`hidden size ${c.hidden} is not divisible by ${c.heads} heads`);
  }
  if (c.arch === 'llama') {
    if (c.heads % c.kvHeads !== 0) throw new InvalidArgumentError(`${c.heads} heads are not a multiple of ${c.kvHeads} kv heads`);
    if (c.headDim % 2 !== 0) throw new InvalidArgumentError(`head dim ${c.headDim} must be even for rotary embeddings`);
    validateLlamaConfig(c);
  }
  return c;
}

type Json = Record<string, unknown>;

function num(raw: Json, key: string, fallback?: number): number {
  const v = raw[key];
  if (v === undefined || v === null) {
    if (fallback === undefined) throw new InvalidArgumentError(`config.json lacks '${key}'`);
    return fallback;
  }
  if (typeof v !== 'number') throw new InvalidArgumentError(`config.json '${key}' must be a number`);
  return v;
}

function firstId(v: unknown): number | undefined {
  if (typeof v === 'number') return v;
  if (Array.isArray(v) && typeof v[0] === 'number') return v[0];
  return undefined;
}

/** Reads a Hugging Face config.json object. */
export function configFromHF(raw: Json): ModelConfig {
  const type = raw.model_type;
  if (type === 'gpt_neox') return validateConfig(gptNeoXFromHF(raw));
  if (type === 'falcon') return validateConfig(falconFromHF(raw));
  if (type === 'bloom') return validateConfig(bloomFromHF(raw));
  if (isGemmaType(type)) return validateConfig(gemmaFromHF(raw, type));
  if (type === 'mixtral') return validateConfig(mixtralFromHF(raw));
  if (type === 'qwen3_moe') return validateConfig(qwen3MoeFromHF(raw));
  if (type === 'gpt2') {
    const hidden = num(raw, 'n_embd');
    const act = raw.activation_function;
    if (act !== undefined && act !== 'gelu_new' && act !== 'gelu_pytorch_tanh') {
      throw new InvalidArgumentError(`GPT-2 activation '${String(act)}' is not supported (gelu_new only)`);
    }
    return validateConfig(
      gpt2Config({
        vocabSize: num(raw, 'vocab_size'),
        maxPositions: num(raw, 'n_positions', 1024),
        hidden,
        layers: num(raw, 'n_layer'),
        heads: num(raw, 'n_head'),
        intermediate: num(raw, 'n_inner', 4 * hidden),
        normEps: num(raw, 'layer_norm_epsilon', 1e-5),
        initializerRange: num(raw, 'initializer_range', 0.02),
        tieWordEmbeddings: raw.tie_word_embeddings !== false,
        bosTokenId: firstId(raw.bos_token_id),
        eosTokenId: firstId(raw.eos_token_id),
      }),
    );
  }
  if (isLlamaFamily(type)) return validateConfig(llamaConfigFromHF(raw, type));
  throw new InvalidArgumentError(`model_type '${String(type)}' is not supported (gpt2, llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, mixtral, qwen3_moe, gpt_neox, falcon, bloom)`);
}

/** Writes a config as Hugging Face's config.json object. */
export function configToHF(c: ModelConfig): Json {
  if (c.arch === 'gpt_neox') return gptNeoXToHF(c);
  if (c.arch === 'falcon') return falconToHF(c);
  if (c.arch === 'bloom') return bloomToHF(c);
  if (c.arch === 'gemma') return gemmaToHF(c);
  if (c.arch === 'mixtral') return mixtralToHF(c);
  if (c.arch === 'qwen3_moe') return qwen3MoeToHF(c);
  if (c.arch === 'gpt2') {
    return {
      architectures: ['GPT2LMHeadModel'],
      model_type: 'gpt2',
      vocab_size: c.vocabSize,
      n_positions: c.maxPositions,
      n_ctx: c.maxPositions,
      n_embd: c.hidden,
      n_layer: c.layers,
      n_head: c.heads,
      n_inner: c.intermediate,
      activation_function: 'gelu_new',
      layer_norm_epsilon: c.normEps,
      initializer_range: c.initializerRange,
      resid_pdrop: 0,
      embd_pdrop: 0,
      attn_pdrop: 0,
      tie_word_embeddings: c.tieWordEmbeddings,
      bos_token_id: c.bosTokenId,
      eos_token_id: c.eosTokenId,
      torch_dtype: 'float32',
    };
  }
  return llamaConfigToHF(c);
}
