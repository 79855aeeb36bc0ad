import { InvalidArgumentError } from '../errors.ts';
import { type DecoderConfig, decoderConfig, type AttentionLayerType } from './config.ts';
import type { CheckpointLayout, SmallShape } from './families/family.ts';
import { firstId, num } from './config-fields.ts';
import { ropeFromHF, ropeToHF } from './rope.ts';

/**
 * The shared decoder's config (DecoderConfig) read from and written to config.json as transformers 5.17 reads it: the
 * fields every family built on it has. Each family's record (families/*.ts) adds its own: its defaults, its biases,
 * its window, its rotary; and says which of the optional fields it takes (DecoderFields), which validateDecoderConfig
 * checks. The config's modelType says which family it is.
 */

type Json = Record<string, unknown>;

/** What a family's config class defaults to where config.json leaves a field out. */
export interface DecoderDefaults {
  maxPositions: number;
  normEps: number;
  /** Per-head size (absent: hidden / heads). */
  headDim?: number;
  /** Whether the family reads partial_rotary_factor (the others refuse any but 1). */
  partialRotary?: boolean;
}

/** The shared fields of a family's config.json as a DecoderConfig of `modelType`, without biases (not yet validated). */
export function decoderConfigFromHF(raw: Json, modelType: string, d: DecoderDefaults): DecoderConfig {
  const act = raw.hidden_act;
  if (act !== undefined && act !== 'silu') throw new InvalidArgumentError(`hidden_act '${String(act)}' is not supported (silu only)`);
  const hidden = num(raw, 'hidden_size');
  const heads = num(raw, 'num_attention_heads');
  const layers = num(raw, 'num_hidden_layers');
  const { theta, scaling } = ropeFromHF(raw);
  const partial = raw.partial_rotary_factor;
  if (partial !== undefined && partial !== null && !d.partialRotary && partial !== 1) {
    throw new InvalidArgumentError(`partial_rotary_factor ${String(partial)} is not supported for ${modelType}`);
  }
  const c: DecoderConfig = {
    arch: 'llama',
    vocabSize: num(raw, 'vocab_size'),
    maxPositions: num(raw, 'max_position_embeddings', d.maxPositions),
    hidden,
    layers,
    heads,
    kvHeads: num(raw, 'num_key_value_heads', heads),
    headDim: num(raw, 'head_dim', d.headDim ?? hidden / heads),
    intermediate: num(raw, 'intermediate_size'),
    normEps: num(raw, 'rms_norm_eps', d.normEps),
    ropeTheta: theta,
    initializerRange: num(raw, 'initializer_range', 0.02),
    tieWordEmbeddings: raw.tie_word_embeddings === true,
    qkvBias: false,
    oBias: false,
    modelType,
    bosTokenId: firstId(raw.bos_token_id),
    eosTokenId: firstId(raw.eos_token_id),
  };
  if (scaling) c.ropeScaling = scaling;
  return c;
}

/** The shared fields of a config as config.json (a family adds its window's keys after). */
export function decoderConfigToHF(c: DecoderConfig, architecture: string): Json {
  const out: Json = {
    architectures: [architecture],
    model_type: c.modelType,
    vocab_size: c.vocabSize,
    max_position_embeddings: c.maxPositions,
    hidden_size: c.hidden,
    intermediate_size: c.intermediate,
    num_hidden_layers: c.layers,
    num_attention_heads: c.heads,
    num_key_value_heads: c.kvHeads,
    head_dim: c.headDim,
    hidden_act: 'silu',
    rms_norm_eps: c.normEps,
    rope_theta: c.ropeTheta,
    initializer_range: c.initializerRange,
    tie_word_embeddings: c.tieWordEmbeddings,
    attention_bias: c.oBias,
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenId,
    torch_dtype: 'float32',
  };
  if (c.ropeScaling) out.rope_scaling = ropeToHF(c.ropeScaling);
  if (c.mlpBias) out.mlp_bias = true;
  if (c.partialRotaryFactor !== undefined) out.partial_rotary_factor = c.partialRotaryFactor;
  return out;
}

/** The window of a config.json (null: none): its sliding_window, or `fallback` when the key is absent. */
export function slidingWindowOf(raw: Json, fallback: number | null): number | null {
  const w = Object.hasOwn(raw, 'sliding_window') ? raw.sliding_window : fallback;
  if (w === null || w === undefined) return null;
  if (typeof w !== 'number' || !Number.isInteger(w) || w <= 0) throw new InvalidArgumentError(`config.json sliding_window must be a positive integer or null, got ${JSON.stringify(w)}`);
  return w;
}

/**
 * Blocks with a window named per block: a window (when use_sliding_window) on the blocks from max_window_layers on,
 * or on those layer_types names (a window of 4096 unless sliding_window says otherwise).
 */
export function layerTypesFromHF(raw: Json, layers: number): { slidingWindow?: number; layerTypes?: AttentionLayerType[] } {
  const window = raw.use_sliding_window === true ? slidingWindowOf(raw, 4096) : null;
  let types: AttentionLayerType[];
  if (raw.layer_types !== undefined && raw.layer_types !== null) {
    const given = raw.layer_types;
    if (!Array.isArray(given) || given.length !== layers || given.some((t) => t !== 'full_attention' && t !== 'sliding_attention')) {
      throw new InvalidArgumentError(`config.json layer_types must name full_attention or sliding_attention for each of ${layers} layers, got ${JSON.stringify(given)}`);
    }
    types = given as AttentionLayerType[];
  } else {
    const first = num(raw, 'max_window_layers', 28);
    types = Array.from({ length: layers }, (_, i) => (window !== null && i >= first ? 'sliding_attention' : 'full_attention'));
  }
  if (window === null || types.every((t) => t === 'full_attention')) return {};
  // canonical: no layerTypes when every block slides
  return types.every((t) => t === 'sliding_attention') ? { slidingWindow: window } : { slidingWindow: window, layerTypes: types };
}

/** layerTypesFromHF's keys for a config's window (none when it has none). */
export function layerTypesToHF(c: DecoderConfig): Json {
  if (c.slidingWindow === undefined) return {};
  const out: Json = { use_sliding_window: true, sliding_window: c.slidingWindow, max_window_layers: 0 };
  if (c.layerTypes) out.layer_types = c.layerTypes;
  return out;
}

/** The optional fields of DecoderConfig a family takes; validateDecoderConfig refuses the others, naming them. */
export interface DecoderFields {
  slidingWindow?: boolean;
  layerTypes?: boolean;
  partialRotary?: boolean;
  ropeScaling?: boolean;
  attentionBias?: boolean;
  mlpBias?: boolean;
}

/** The checks of a shared-decoder config beyond its sizes: its heads, and each optional field only where `has` says. */
export function validateDecoderConfig(c: DecoderConfig, has: DecoderFields): void {
  const type = c.modelType;
  if (c.heads % c.kvHeads !== 0) throw new InvalidArgumentError(`${c.heads} heads are not a multiple of ${c.kvHeads} kv heads`);
  if (c.headDim % 2 !== 0) throw new InvalidArgumentError(`head dim ${c.headDim} must be even for rotary embeddings`);
  if (c.slidingWindow !== undefined) {
    if (!has.slidingWindow) throw new InvalidArgumentError(`sliding_window is not part of model_type '${type}'`);
    if (!Number.isInteger(c.slidingWindow) || c.slidingWindow <= 0) throw new InvalidArgumentError(`sliding_window must be a positive integer, got ${c.slidingWindow}`);
  }
  if (c.layerTypes !== undefined) {
    if (!has.layerTypes) throw new InvalidArgumentError(`layer_types is not read for model_type '${type}'`);
    if (c.layerTypes.length !== c.layers) throw new InvalidArgumentError(`layer_types has ${c.layerTypes.length} entries for ${c.layers} layers`);
    if (c.slidingWindow === undefined) throw new InvalidArgumentError('layer_types name sliding layers but sliding_window is unset');
  }
  if (c.partialRotaryFactor !== undefined) {
    if (!has.partialRotary) throw new InvalidArgumentError(`partial_rotary_factor is not supported for ${type}`);
    const r = rotaryDim(c);
    if (!(c.partialRotaryFactor > 0 && c.partialRotaryFactor <= 1) || r % 2 !== 0 || r === 0) {
      throw new InvalidArgumentError(`partial_rotary_factor ${c.partialRotaryFactor} gives ${r} rotary dims of ${c.headDim}: they must be even and more than 0`);
    }
  }
  if (c.ropeScaling && !has.ropeScaling) throw new InvalidArgumentError(`${type} rope_scaling type '${c.ropeScaling.type}' is not supported (default only)`);
  if (!has.attentionBias && (c.qkvBias || c.oBias)) throw new InvalidArgumentError(`model_type '${type}' has no attention biases`);
  if (c.mlpBias && !has.mlpBias) throw new InvalidArgumentError(`mlp_bias is not part of model_type '${type}'`);
}

/** The window of block `i` (undefined: full attention). */
export function blockWindow(c: DecoderConfig, i: number): number | undefined {
  if (c.slidingWindow === undefined) return undefined;
  return !c.layerTypes || c.layerTypes[i] === 'sliding_attention' ? c.slidingWindow : undefined;
}

/** Dims rotated in each head: all, or int(head dim × partial_rotary_factor) as transformers. */
export function rotaryDim(c: DecoderConfig): number {
  return c.partialRotaryFactor === undefined ? c.headDim : Math.floor(c.headDim * c.partialRotaryFactor);
}

/** Where the shared decoder's weights sit in a checkpoint (every family built on it names them alike). */
export const DECODER_LAYOUT: CheckpointLayout = {
  table: 'model.embed_tokens.weight',
  blocks: 'model.layers',
  norm: /^model\.norm\.weight$/,
  head: 'lm_head.weight',
};

/**
 * A small shared-decoder config of `modelType` at init-model's shape: a SwiGLU 8/3 as wide as the hidden state, the
 * head tied to the embedding; `extra` sets the family's own fields (a bias, a window). InvalidArgumentError when the
 * heads do not split into the key/value heads.
 */
export function smallDecoder(s: SmallShape, modelType: string, extra: Partial<DecoderConfig> = {}): DecoderConfig {
  const { vocabSize, hidden, heads, layers, maxPositions, bosTokenId, eosTokenId, kvHeads } = s;
  const c = decoderConfig({
    vocabSize, hidden, heads, layers, maxPositions, bosTokenId, eosTokenId,
    kvHeads,
    intermediate: s.intermediate ?? Math.round((8 * hidden) / 3),
    tieWordEmbeddings: true,
    modelType,
    ...extra,
  });
  if (heads % c.kvHeads !== 0) throw new InvalidArgumentError(`--heads ${heads} is not a multiple of --kv-heads`);
  return c;
}
