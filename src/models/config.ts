import { InvalidArgumentError } from '../errors.ts';
import type { BloomConfig } from './families/bloom.ts';
import type { FalconConfig } from './families/falcon.ts';
import type { GemmaConfig } from './families/gemma.ts';
import type { GPTNeoXConfig } from './families/gpt-neox.ts';
import type { MixtralConfig } from './families/mixtral.ts';
import type { Qwen3MoeConfig } from './families/qwen3-moe.ts';
import type { GPT2Config } from './families/gpt2.ts';
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

/** Checks the sizes every config has against CONFIG_LIMITS (the family's own checks are its record's validate). */
export function validateSizes(c: ModelConfig): void {
  for (const k of Object.keys(CONFIG_LIMITS) as (keyof typeof CONFIG_LIMITS)[]) {
    if (!Number.isInteger(c[k]) || c[k] <= 0) throw new InvalidArgumentError(`config ${k} must be a positive integer, got ${c[k]}`);
    if (c[k] > CONFIG_LIMITS[k]) throw new InvalidArgumentError(`config ${k} is ${c[k]}, more than the ${CONFIG_LIMITS[k]} any model here may have`);
  }
}
