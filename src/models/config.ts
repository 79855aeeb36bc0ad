import { InvalidArgumentError } from '../errors.ts';
import type { ModelConfig } from './families/index.ts';
import type { RopeScaling } from './rope.ts';

/** The config of any family (the union of the records' config types, in the registry). */
export type { ModelConfig } from './families/index.ts';

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
export type AttentionLayerType = 'full_attention' | 'sliding_attention';

/**
 * The shared decoder's config (decoder.ts; the families built on it read and write it in decoder-config.ts, and their
 * records say which of its optional fields each takes). Its `arch` tag is the first family's name, as configs were
 * saved and sent before the registry; modelType says which family it is.
 */
export interface DecoderConfig extends DecoderConfigBase {
  arch: 'llama';
  /** Key/value heads for grouped-query attention (= heads for multi-head attention). */
  kvHeads: number;
  /** Per-head size (hidden / heads unless the config says otherwise). */
  headDim: number;
  /** Rotary base (10000). */
  ropeTheta: number;
  /** Bias on the q, k, v projections, and on o (config.json's attention_bias sets both in some families). */
  qkvBias: boolean;
  oBias: boolean;
  /** The Hugging Face model_type this came from: its family (the record that reads, writes and builds it). */
  modelType: string;
  /** rope_scaling (linear, dynamic, yarn, llama3); absent: the plain rotary. */
  ropeScaling?: RopeScaling;
  /** partial_rotary_factor: the fraction of each head's dims that rotate (absent: all). */
  partialRotaryFactor?: number;
  /** Sliding window: a token attends to itself and the window − 1 before it (absent: no window). */
  slidingWindow?: number;
  /** Which blocks the window applies to (layer_types; absent: every block). */
  layerTypes?: AttentionLayerType[];
  /** Biases on the MLP's projections (mlp_bias). */
  mlpBias?: boolean;
}

/** Whether a config is the shared decoder's (whichever family built on it: its modelType says). */
export function isDecoderConfig(c: ModelConfig): c is DecoderConfig {
  return c.arch === 'llama';
}

/** A shared-decoder config: a 7B shape (32 blocks of 4096, 32 heads, a SwiGLU of 11008) unless overridden. */
export function decoderConfig(overrides: Partial<Omit<DecoderConfig, 'arch'>> = {}): DecoderConfig {
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
