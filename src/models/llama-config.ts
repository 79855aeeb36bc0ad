import { InvalidArgumentError } from '../errors.ts';
import type { LlamaConfig, LlamaLayerType } from './config.ts';
import { ropeFromHF, ropeToHF } from './rope.ts';

/**
 * The Llama-like families, read from and written to config.json as transformers 5.17 reads
 * them: Llama (and Llama 3's rope scalings), Mistral (a sliding window on every block), Qwen2
 * and Qwen3 (biased q/k/v, q/k norms, windows on the blocks past max_window_layers), Phi-3
 * (fused projections, partial rotary). All reduce to LlamaConfig; its modelType says which.
 */

export const LLAMA_FAMILIES = {
  llama: 'LlamaForCausalLM',
  mistral: 'MistralForCausalLM',
  qwen2: 'Qwen2ForCausalLM',
  qwen3: 'Qwen3ForCausalLM',
  phi3: 'Phi3ForCausalLM',
} as const;
export type LlamaFamily = keyof typeof LLAMA_FAMILIES;

export function isLlamaFamily(type: unknown): type is LlamaFamily {
  return typeof type === 'string' && Object.hasOwn(LLAMA_FAMILIES, type);
}

/** transformers' defaults where config.json leaves a field out. */
const DEFAULTS: Record<LlamaFamily, { maxPositions: number; normEps: number; slidingWindow: number | null }> = {
  llama: { maxPositions: 2048, normEps: 1e-6, slidingWindow: null },
  mistral: { maxPositions: 131072, normEps: 1e-6, slidingWindow: 4096 },
  qwen2: { maxPositions: 32768, normEps: 1e-6, slidingWindow: 4096 },
  qwen3: { maxPositions: 32768, normEps: 1e-6, slidingWindow: 4096 },
  phi3: { maxPositions: 4096, normEps: 1e-5, slidingWindow: null },
};

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

/** The window of a family's config.json (null: none), as transformers' config classes set it. */
function slidingWindowOf(raw: Json, type: LlamaFamily): number | null {
  const fallback = DEFAULTS[type].slidingWindow;
  const w = Object.hasOwn(raw, 'sliding_window') ? raw.sliding_window : fallback;
  if (w === null || w === undefined) return null;
  if (typeof w !== 'number' || !Number.isInteger(w) || w <= 0) throw new InvalidArgumentError(`config.json sliding_window must be a positive integer or null, got ${JSON.stringify(w)}`);
  return w;
}

/** Qwen's blocks: a window (when use_sliding_window) on the blocks from max_window_layers on, or on those layer_types names. */
function qwenLayerTypes(raw: Json, layers: number): { slidingWindow?: number; layerTypes?: LlamaLayerType[] } {
  const window = raw.use_sliding_window === true ? slidingWindowOf(raw, 'qwen3') : null;
  let types: LlamaLayerType[];
  if (raw.layer_types !== undefined && raw.layer_types !== null) {
    const given = raw.layer_types;
    if (!Array.isArray(given) || given.length !== layers || given.some((t) => t !== 'full_attention' && t !== 'sliding_attention')) {
      throw new InvalidArgumentError(`config.json layer_types must name full_attention or sliding_attention for each of ${layers} layers, got ${JSON.stringify(given)}`);
    }
    types = given as LlamaLayerType[];
  } else {
    const first = num(raw, 'max_window_layers', 28);
    types = Array.from({ length: layers }, (_, i) => (window !== null && i >= first ? 'sliding_attention' : 'full_attention'));
  }
  if (window === null || types.every((t) => t === 'full_attention')) return {};
  // canonical: no layerTypes when every block slides
  return types.every((t) => t === 'sliding_attention') ? { slidingWindow: window } : { slidingWindow: window, layerTypes: types };
}

/** A Llama-like config.json (model_type llama, mistral, qwen2, qwen3 or phi3) as a LlamaConfig (not yet validated). */
export function llamaConfigFromHF(raw: Json, type: LlamaFamily): LlamaConfig {
  const act = raw.hidden_act;
  if (act !== undefined && act !== 'silu') throw new InvalidArgumentError(`hidden_act '${String(act)}' is not supported (silu only)`);
  const hidden = num(raw, 'hidden_size');
  const heads = num(raw, 'num_attention_heads');
  const layers = num(raw, 'num_hidden_layers');
  const attentionBias = raw.attention_bias === true;
  const { theta, scaling } = ropeFromHF(raw);
  if (type === 'phi3' && scaling) {
    throw new InvalidArgumentError(`phi3 rope_scaling type '${scaling.type}' is not supported (default only)`);
  }
  const partial = raw.partial_rotary_factor;
  if (partial !== undefined && partial !== null && type !== 'phi3' && partial !== 1) {
    throw new InvalidArgumentError(`partial_rotary_factor ${String(partial)} is not supported for ${type}`);
  }
  const c: LlamaConfig = {
    arch: 'llama',
    vocabSize: num(raw, 'vocab_size'),
    maxPositions: num(raw, 'max_position_embeddings', DEFAULTS[type].maxPositions),
    hidden,
    layers,
    heads,
    kvHeads: num(raw, 'num_key_value_heads', heads),
    headDim: num(raw, 'head_dim', type === 'qwen3' ? 128 : hidden / heads),
    intermediate: num(raw, 'intermediate_size'),
    normEps: num(raw, 'rms_norm_eps', DEFAULTS[type].normEps),
    ropeTheta: theta,
    initializerRange: num(raw, 'initializer_range', 0.02),
    tieWordEmbeddings: raw.tie_word_embeddings === true,
    // Qwen2 biases q, k, v always; Llama and Qwen3 bias all four with attention_bias; Mistral and Phi-3 none
    qkvBias: type === 'qwen2' || ((type === 'llama' || type === 'qwen3') && attentionBias),
    oBias: (type === 'llama' || type === 'qwen3') && attentionBias,
    modelType: type,
    bosTokenId: firstId(raw.bos_token_id),
    eosTokenId: firstId(raw.eos_token_id),
  };
  if (scaling) c.ropeScaling = scaling;
  if (type === 'phi3' && partial !== undefined && partial !== null && partial !== 1) {
    if (typeof partial !== 'number') throw new InvalidArgumentError(`config.json partial_rotary_factor must be a number`);
    c.partialRotaryFactor = partial;
  }
  if (type === 'llama' && raw.mlp_bias === true) c.mlpBias = true;
  if (type === 'mistral' || type === 'phi3') {
    const window = slidingWindowOf(raw, type);
    if (window !== null) c.slidingWindow = window;
  }
  if (type === 'qwen2' || type === 'qwen3') Object.assign(c, qwenLayerTypes(raw, layers));
  return c;
}

/** A Llama-like config as the config.json transformers reads back into the same model. */
export function llamaConfigToHF(c: LlamaConfig): Json {
  const type = (isLlamaFamily(c.modelType) ? c.modelType : 'llama') as LlamaFamily;
  const out: Json = {
    architectures: [LLAMA_FAMILIES[type]],
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
  // Mistral's sliding_window defaults to 4096 when left out: write null for none
  if (type === 'mistral' || (type === 'phi3' && c.slidingWindow !== undefined)) out.sliding_window = c.slidingWindow ?? null;
  if ((type === 'qwen2' || type === 'qwen3') && c.slidingWindow !== undefined) {
    out.use_sliding_window = true;
    out.sliding_window = c.slidingWindow;
    out.max_window_layers = 0;
    if (c.layerTypes) out.layer_types = c.layerTypes;
  }
  return out;
}

/** The checks of a Llama-like config beyond its sizes: each field only where its family has it. */
export function validateLlamaConfig(c: LlamaConfig): void {
  const type = c.modelType;
  if (!isLlamaFamily(type)) throw new InvalidArgumentError(`model_type '${type}' is not a Llama-like family (${Object.keys(LLAMA_FAMILIES).join(', ')})`);
  if (c.slidingWindow !== undefined) {
    if (type === 'llama') throw new InvalidArgumentError(`sliding_window is not part of model_type 'llama' (mistral, qwen2, qwen3, phi3 have it)`);
    if (!Number.isInteger(c.slidingWindow) || c.slidingWindow <= 0) throw new InvalidArgumentError(`sliding_window must be a positive integer, got ${c.slidingWindow}`);
  }
  if (c.layerTypes !== undefined) {
    if (type !== 'qwen2' && type !== 'qwen3') throw new InvalidArgumentError(`layer_types is not read for model_type '${type}' (qwen2, qwen3 only)`);
    if (c.layerTypes.length !== c.layers) throw new InvalidArgumentError(`layer_types has ${c.layerTypes.length} entries for ${c.layers} layers`);
    if (c.slidingWindow === undefined) throw new InvalidArgumentError('layer_types name sliding layers but sliding_window is unset');
  }
  if (c.partialRotaryFactor !== undefined) {
    if (type !== 'phi3') throw new InvalidArgumentError(`partial_rotary_factor is not supported for ${type}`);
    const r = rotaryDim(c);
    if (!(c.partialRotaryFactor > 0 && c.partialRotaryFactor <= 1) || r % 2 !== 0 || r === 0) {
      throw new InvalidArgumentError(`partial_rotary_factor ${c.partialRotaryFactor} gives ${r} rotary dims of ${c.headDim}: they must be even and more than 0`);
    }
  }
  if (c.ropeScaling && type === 'phi3') throw new InvalidArgumentError(`phi3 rope_scaling type '${c.ropeScaling.type}' is not supported (default only)`);
  if ((type === 'mistral' || type === 'phi3') && (c.qkvBias || c.oBias)) throw new InvalidArgumentError(`model_type '${type}' has no attention biases`);
  if (c.mlpBias && type !== 'llama') throw new InvalidArgumentError(`mlp_bias is not part of model_type '${type}'`);
}

/** The window of block `i` (undefined: full attention). */
export function blockWindow(c: LlamaConfig, i: number): number | undefined {
  if (c.slidingWindow === undefined) return undefined;
  return !c.layerTypes || c.layerTypes[i] === 'sliding_attention' ? c.slidingWindow : undefined;
}

/** Dims rotated in each head: all, or int(head dim × partial_rotary_factor) as transformers. */
export function rotaryDim(c: LlamaConfig): number {
  return c.partialRotaryFactor === undefined ? c.headDim : Math.floor(c.headDim * c.partialRotaryFactor);
}
