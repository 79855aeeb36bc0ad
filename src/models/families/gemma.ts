import { InvalidArgumentError } from '../../errors.ts';
import { Embedding, type Linear, Module, ModuleList } from '../../nn/index.ts';
import { Generator, rmsNorm, type Tensor, zeros } from '../../tensor/index.ts';
import type { AttentionOptions } from '../attention.ts';
import type { DecoderConfigBase, AttentionLayerType } from '../config.ts';
import { type BlockAttention, normalInit, proj } from '../decoder-parts.ts';
import { type ForwardContext, type LayerProfile, layerProfile,
  type ModelLayer, type ModelPart, type SectionParts } from '../model.ts';
import { cachedRotaryTables, type RopeScaling, ropeFromHF, type RopeSpec, ropeToHF } from '../rope.ts';
import { DecoderLM, decoderLayers, sectionSetup } from '../decoder-layers.ts';
import { DECODER_LAYOUT } from '../decoder-config.ts';
import { DecoderAttention, decoderBlockWeights, DecoderMLP } from '../decoder.ts';
import { denseBlockProfile, type Family, type NamedShape, noWindow, smallBase } from './family.ts';

/**
 * Gemma 2 and Gemma 3 (text) as transformers' Gemma2ForCausalLM and Gemma3ForCausalLM. What
 * differs from the shared decoder: RMSNorms that scale by (1 + w), the token embedding scaled by √hidden, a
 * GeGLU MLP (tanh GELU), norms after the attention and the MLP as well as before, scores scaled
 * by query_pre_attn_scalar^−½, sliding and global blocks (layer_types). Gemma 2 soft-caps the
 * attention scores and the logits; Gemma 3 normalises queries and keys per head, gives its
 * sliding blocks their own rotary base (rope_local_base_freq) and its global blocks the scaling.
 */

export type GemmaType = 'gemma2' | 'gemma3_text';

export interface GemmaConfig extends DecoderConfigBase {
  arch: 'gemma';
  modelType: GemmaType;
  kvHeads: number;
  /** Per-head size (256 by default, not hidden / heads). */
  headDim: number;
  /** Rotary base of the global blocks (and of every block in Gemma 2). */
  ropeTheta: number;
  /** rope_scaling of the global blocks (of every block in Gemma 2). */
  ropeScaling?: RopeScaling;
  /** Gemma 3: the rotary base of the sliding blocks (rope_local_base_freq). */
  ropeLocalTheta?: number;
  /** Biases on q, k, v and o. */
  attentionBias: boolean;
  /** Scores are scaled by queryPreAttnScalar^−½. */
  queryPreAttnScalar: number;
  /** The window of the sliding blocks. */
  slidingWindow: number;
  /** Each block's attention: sliding or global. */
  layerTypes: AttentionLayerType[];
  /** Gemma 2: scores become cap · tanh(scores / cap) (attn_logit_softcapping). */
  attnSoftcap?: number;
  /** Logits become cap · tanh(logits / cap) (final_logit_softcapping). */
  finalSoftcap?: number;
}

const ARCHITECTURES: Record<GemmaType, string> = { gemma2: 'Gemma2ForCausalLM', gemma3_text: 'Gemma3ForCausalLM' };

/** transformers' defaults where config.json leaves a field out. */
const DEFAULTS: Record<GemmaType, { maxPositions: number; attnSoftcap: number | null; finalSoftcap: number | null }> = {
  gemma2: { maxPositions: 8192, attnSoftcap: 50, finalSoftcap: 30 },
  gemma3_text: { maxPositions: 131072, attnSoftcap: null, finalSoftcap: null },
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

function optional(raw: Json, key: string, fallback: number | null): number | undefined {
  const v = Object.hasOwn(raw, key) ? raw[key] : fallback;
  if (v === null || v === undefined) return undefined;
  if (typeof v !== 'number' || !(v > 0)) throw new InvalidArgumentError(`config.json '${key}' must be a positive number or null, got ${JSON.stringify(v)}`);
  return v;
}

function firstId(v: unknown): number | undefined {
  if (typeof v === 'number') return v;
  if (Array.isArray(v) && typeof v[0] === 'number') return v[0];
  return undefined;
}

export function isGemmaType(type: unknown): type is GemmaType {
  return type === 'gemma2' || type === 'gemma3_text';
}

/**
 * Gemma 3's rotaries: the global blocks' (rope_theta, rope_scaling) and the sliding blocks'
 * (rope_local_base_freq), or per-type rope_parameters.
 */
function gemma3Rope(raw: Json): { theta: number; scaling?: RopeScaling; localTheta: number } {
  const perType = raw.rope_parameters as Json | null | undefined;
  if (perType && typeof perType === 'object' && ('full_attention' in perType || 'sliding_attention' in perType)) {
    const full = ropeFromHF({ rope_parameters: perType.full_attention ?? null }, num(raw, 'rope_theta', 1_000_000));
    const local = ropeFromHF({ rope_parameters: perType.sliding_attention ?? null }, num(raw, 'rope_local_base_freq', 10000));
    if (local.scaling) throw new InvalidArgumentError(`gemma3_text rope_parameters.sliding_attention type '${local.scaling.type}' is not supported (default only)`);
    return { theta: full.theta, scaling: full.scaling, localTheta: local.theta };
  }
  const full = ropeFromHF({ ...raw, rope_parameters: null }, 1_000_000);
  return { theta: full.theta, scaling: full.scaling, localTheta: num(raw, 'rope_local_base_freq', 10000) };
}

/** A gemma2 or gemma3_text config.json as a GemmaConfig (not yet validated). */
export function gemmaFromHF(raw: Json, type: GemmaType): GemmaConfig {
  const act = raw.hidden_activation ?? 'gelu_pytorch_tanh';
  if (act !== 'gelu_pytorch_tanh') throw new InvalidArgumentError(`${type} hidden_activation '${String(act)}' is not supported (gelu_pytorch_tanh only)`);
  if (raw.use_bidirectional_attention === true) throw new InvalidArgumentError(`${type} use_bidirectional_attention is not supported (causal only)`);
  const layers = num(raw, 'num_hidden_layers');
  const heads = num(raw, 'num_attention_heads');
  let layerTypes: AttentionLayerType[];
  if (raw.layer_types !== undefined && raw.layer_types !== null) {
    const given = raw.layer_types;
    if (!Array.isArray(given) || given.length !== layers || given.some((t) => t !== 'full_attention' && t !== 'sliding_attention')) {
      throw new InvalidArgumentError(`config.json layer_types must name full_attention or sliding_attention for each of ${layers} layers, got ${JSON.stringify(given)}`);
    }
    layerTypes = given as AttentionLayerType[];
  } else {
    // Gemma 2 alternates sliding and global; Gemma 3 has one global block in every sliding_window_pattern (6)
    const pattern = type === 'gemma2' ? 2 : num(raw, 'sliding_window_pattern', 6);
    layerTypes = Array.from({ length: layers }, (_, i) => ((i + 1) % pattern !== 0 ? 'sliding_attention' : 'full_attention'));
  }
  const window = optional(raw, 'sliding_window', 4096);
  if (window === undefined && layerTypes.includes('sliding_attention')) throw new InvalidArgumentError(`${type} sliding_window is null but layer_types has sliding layers`);
  const c: GemmaConfig = {
    arch: 'gemma',
    modelType: type,
    vocabSize: num(raw, 'vocab_size'),
    maxPositions: num(raw, 'max_position_embeddings', DEFAULTS[type].maxPositions),
    hidden: num(raw, 'hidden_size'),
    layers,
    heads,
    kvHeads: num(raw, 'num_key_value_heads', heads),
    headDim: num(raw, 'head_dim', 256),
    intermediate: num(raw, 'intermediate_size'),
    normEps: num(raw, 'rms_norm_eps', 1e-6),
    ropeTheta: 0,
    initializerRange: num(raw, 'initializer_range', 0.02),
    tieWordEmbeddings: raw.tie_word_embeddings !== false,
    attentionBias: raw.attention_bias === true,
    queryPreAttnScalar: num(raw, 'query_pre_attn_scalar', 256),
    slidingWindow: window ?? 4096,
    layerTypes,
    bosTokenId: firstId(raw.bos_token_id),
    eosTokenId: firstId(raw.eos_token_id),
  };
  if (type === 'gemma2') {
    const rope = ropeFromHF(raw);
    c.ropeTheta = rope.theta;
    if (rope.scaling) c.ropeScaling = rope.scaling;
    // Gemma 3's attention takes no soft-cap in transformers (its attn_logit_softcapping is unused)
    const attnCap = optional(raw, 'attn_logit_softcapping', DEFAULTS[type].attnSoftcap);
    if (attnCap !== undefined) c.attnSoftcap = attnCap;
  } else {
    const rope = gemma3Rope(raw);
    c.ropeTheta = rope.theta;
    if (rope.scaling) c.ropeScaling = rope.scaling;
    c.ropeLocalTheta = rope.localTheta;
  }
  const finalCap = optional(raw, 'final_logit_softcapping', DEFAULTS[type].finalSoftcap);
  if (finalCap !== undefined) c.finalSoftcap = finalCap;
  return c;
}

/** A Gemma config as the config.json transformers reads back into the same model. */
export function gemmaToHF(c: GemmaConfig): Json {
  const out: Json = {
    architectures: [ARCHITECTURES[c.modelType]],
    model_type: c.modelType,
    vocab_size: c.vocabSize,
    max_position_embeddings: c.maxPositions,
    hidden_size: c.hidden,
    intermediate_size: c.intermediate,
    num_hidden_layers: c.layers,
    num_attention_heads: c.heads,
    num_key_value_heads: c.kvHeads,
    head_dim: c.headDim,
    hidden_activation: 'gelu_pytorch_tanh',
    rms_norm_eps: c.normEps,
    rope_theta: c.ropeTheta,
    rope_scaling: ropeToHF(c.ropeScaling),
    initializer_range: c.initializerRange,
    tie_word_embeddings: c.tieWordEmbeddings,
    attention_bias: c.attentionBias,
    query_pre_attn_scalar: c.queryPreAttnScalar,
    sliding_window: c.slidingWindow,
    layer_types: c.layerTypes,
    final_logit_softcapping: c.finalSoftcap ?? null,
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenId,
    torch_dtype: 'float32',
  };
  if (c.modelType === 'gemma2') out.attn_logit_softcapping = c.attnSoftcap ?? null;
  else out.rope_local_base_freq = c.ropeLocalTheta ?? 10000;
  return out;
}

export function validateGemma(c: GemmaConfig): void {
  if (!isGemmaType(c.modelType)) throw new InvalidArgumentError(`model_type '${String(c.modelType)}' is not a Gemma (gemma2, gemma3_text)`);
  if (c.heads % c.kvHeads !== 0) throw new InvalidArgumentError(`${c.heads} heads are not a multiple of ${c.kvHeads} kv heads`);
  if (!Number.isInteger(c.headDim) || c.headDim <= 0 || c.headDim % 2 !== 0) throw new InvalidArgumentError(`head dim ${c.headDim} must be a positive even integer`);
  if (c.layerTypes.length !== c.layers) throw new InvalidArgumentError(`layer_types has ${c.layerTypes.length} entries for ${c.layers} layers`);
  if (!Number.isInteger(c.slidingWindow) || c.slidingWindow <= 0) throw new InvalidArgumentError(`sliding_window must be a positive integer, got ${c.slidingWindow}`);
  if (c.attnSoftcap !== undefined && c.modelType !== 'gemma2') throw new InvalidArgumentError(`attn_logit_softcapping is not applied by ${c.modelType}`);
  if (c.ropeLocalTheta !== undefined && c.modelType !== 'gemma3_text') throw new InvalidArgumentError(`rope_local_base_freq is not part of ${c.modelType}`);
}

export function gemmaConfig(overrides: Partial<Omit<GemmaConfig, 'arch'>> = {}): GemmaConfig {
  const layers = overrides.layers ?? 4;
  const modelType = overrides.modelType ?? 'gemma3_text';
  const heads = overrides.heads ?? 4;
  const headDim = overrides.headDim ?? 32;
  return {
    arch: 'gemma',
    modelType,
    vocabSize: 262_208,
    maxPositions: 8192,
    hidden: 128,
    intermediate: 512,
    normEps: 1e-6,
    ropeTheta: modelType === 'gemma2' ? 10000 : 1_000_000,
    initializerRange: 0.02,
    tieWordEmbeddings: true,
    attentionBias: false,
    slidingWindow: 4096,
    bosTokenId: 2,
    eosTokenId: 1,
    ...(modelType === 'gemma2' ? { attnSoftcap: 50, finalSoftcap: 30 } : { ropeLocalTheta: 10000 }),
    ...overrides,
    layers,
    heads,
    headDim,
    kvHeads: overrides.kvHeads ?? heads,
    queryPreAttnScalar: overrides.queryPreAttnScalar ?? headDim,
    layerTypes: overrides.layerTypes
      ?? Array.from({ length: layers }, (_, i) => ((i + 1) % (modelType === 'gemma2' ? 2 : 6) !== 0 ? 'sliding_attention' : 'full_attention')),
  };
}

/** Gemma's RMSNorm: x / √(mean(x²) + eps) · (1 + w), its weight starting at zero. */
export class GemmaRMSNorm extends Module {
  readonly weight: Tensor;
  constructor(
    readonly size: number,
    readonly eps: number,
  ) {
    super();
    this.weight = this.addParameter('weight', zeros([size]));
  }

  forward(x: Tensor): Tensor {
    return rmsNorm(x, this.weight.add(1), this.eps);
  }
}

export class GemmaDecoderLayer extends Module {
  readonly input_layernorm: GemmaRMSNorm;
  readonly self_attn: DecoderAttention;
  readonly post_attention_layernorm: GemmaRMSNorm;
  readonly pre_feedforward_layernorm: GemmaRMSNorm;
  readonly mlp: DecoderMLP;
  readonly post_feedforward_layernorm: GemmaRMSNorm;
  private readonly rope: RopeSpec;
  private readonly ropeKey: string;
  private readonly options: AttentionOptions;
  constructor(c: GemmaConfig, rng: Generator, index: number) {
    super();
    this.input_layernorm = this.addModule('input_layernorm', new GemmaRMSNorm(c.hidden, c.normEps));
    // the shared attention: biases on all four or none, Gemma 3's q/k norms (its own RMSNorm)
    const attention = { ...c, qkvBias: c.attentionBias, oBias: c.attentionBias, qkNorm: c.modelType === 'gemma3_text' };
    this.self_attn = this.addModule('self_attn', new DecoderAttention(attention, rng, (size, eps) => new GemmaRMSNorm(size, eps)));
    this.post_attention_layernorm = this.addModule('post_attention_layernorm', new GemmaRMSNorm(c.hidden, c.normEps));
    this.pre_feedforward_layernorm = this.addModule('pre_feedforward_layernorm', new GemmaRMSNorm(c.hidden, c.normEps));
    this.mlp = this.addModule('mlp', new DecoderMLP(c, rng, 'gelu')); // GeGLU: the shared MLP with GELU's tanh
    this.post_feedforward_layernorm = this.addModule('post_feedforward_layernorm', new GemmaRMSNorm(c.hidden, c.normEps));
    const sliding = c.layerTypes[index] === 'sliding_attention';
    this.rope = sliding && c.ropeLocalTheta !== undefined
      ? { theta: c.ropeLocalTheta, rotaryDim: c.headDim, maxPositions: c.maxPositions }
      : { theta: c.ropeTheta, rotaryDim: c.headDim, maxPositions: c.maxPositions, ...(c.ropeScaling ? { scaling: c.ropeScaling } : {}) };
    this.ropeKey = JSON.stringify(this.rope);
    this.options = { scale: c.queryPreAttnScalar ** -0.5 };
    if (sliding) this.options.window = c.slidingWindow;
    if (c.attnSoftcap !== undefined) this.options.softcap = c.attnSoftcap;
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    const at: BlockAttention = { rope: cachedRotaryTables(ctx.positions, this.rope, this.ropeKey), options: this.options };
    x = x.add(this.post_attention_layernorm.forward(this.self_attn.forward(this.input_layernorm.forward(x), ctx, blockIndex, at)));
    return x.add(this.post_feedforward_layernorm.forward(this.mlp.forward(this.pre_feedforward_layernorm.forward(x))));
  }
}

class GemmaModel extends Module {
  readonly embed_tokens: Embedding | null;
  readonly layers: ModuleList<GemmaDecoderLayer>;
  readonly norm: GemmaRMSNorm | null;
  constructor(c: GemmaConfig, rng: Generator, parts: SectionParts) {
    super();
    this.embed_tokens = parts.tokenTable ? this.addModule('embed_tokens', new Embedding(c.vocabSize, c.hidden, { rng })) : null;
    if (this.embed_tokens) normalInit(this.embed_tokens, c.initializerRange, rng);
    const [first, last] = parts.blocks;
    this.layers = this.addModule('layers', new ModuleList(Array.from({ length: last - first }, (_, i) => new GemmaDecoderLayer(c, rng, first + i)), first));
    this.norm = parts.norm ? this.addModule('norm', new GemmaRMSNorm(c.hidden, c.normEps)) : null;
  }
}

export class Gemma extends DecoderLM {
  readonly model: GemmaModel;
  readonly lm_head: Linear | null;

  /** @param options.section build only layers [start, end), uninitialised (see sectionSetup). */
  constructor(
    readonly config: GemmaConfig,
    options: { seed?: number; init?: boolean; section?: ModelPart } = {},
  ) {
    super();
    const { parts, section, rng } = sectionSetup(config.layers, config.tieWordEmbeddings, options);
    this.section = section;
    this.model = this.addModule('model', new GemmaModel(config, rng, parts));
    this.lm_head
      = !config.tieWordEmbeddings && parts.head ? this.addModule('lm_head', proj(config.hidden, config.vocabSize, false, config, rng)) : null;
    this.setLayers(this.buildLayers());
  }

  private buildLayers(): ModelLayer[] {
    const c = this.config;
    const m = this.model;
    const h = c.hidden;
    // a block's profile, counted from its checkpoint names (a section may hold no block to count)
    const profile = gemmaBlockProfile(c);
    const headWeight = () => this.lm_head?.weight ?? m.embed_tokens!.weight;
    const headName = c.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
    const embedScale = Math.fround(Math.sqrt(h)); // transformers' embed_scale, a float32 √hidden
    const cap = c.finalSoftcap;
    return decoderLayers({
      blocks: c.layers, hidden: h, vocab: c.vocabSize,
      embedding: {
        name: 'model.embed_tokens',
        namedParameters: () => [['model.embed_tokens.weight', m.embed_tokens!.weight]],
        forward: (ids) => m.embed_tokens!.forward(ids).mul(embedScale),
        profile: () => layerProfile(c.vocabSize * h, h, h),
      },
      blockPrefix: 'model.layers',
      block: (i) => m.layers.byIndex(i),
      blockProfile: () => ({ ...profile }),
      norm: { name: 'model.norm', module: () => m.norm!, params: h },
      // the final logit soft-cap
      head: { name: 'lm_head', weightName: headName, weight: headWeight, ...(cap === undefined ? {} : { after: (logits) => logits.div(cap).tanh().mul(cap) }) },
    });
  }
}

/** A Gemma block's weights: the shared decoder's (biases all four or none, Gemma 3's q/k norms) and its two MLP norms. */
function gemmaBlockWeights(c: GemmaConfig): NamedShape[] {
  const shared = decoderBlockWeights({ ...c, qkvBias: c.attentionBias, oBias: c.attentionBias, qkNorm: c.modelType === 'gemma3_text' });
  return [...shared, ['pre_feedforward_layernorm.weight', [c.hidden]], ['post_feedforward_layernorm.weight', [c.hidden]]];
}

/** A gemma block's profile for the planner, from its weights. */
function gemmaBlockProfile(c: GemmaConfig): LayerProfile {
  return denseBlockProfile(gemmaBlockWeights(c), c.hidden, c.heads * c.headDim, c.kvHeads * c.headDim);
}

/** The record of a Gemma model_type: both build the same model, their differences in GemmaConfig's fields. */
function gemmaFamily(type: GemmaType, fixture: string): Family<GemmaConfig> {
  return {
    name: type,
    architecture: ARCHITECTURES[type],
    fixtures: [fixture],
    layout: DECODER_LAYOUT,
    owns: (c) => c.arch === 'gemma' && c.modelType === type,
    fromHF: (raw) => gemmaFromHF(raw, type),
    toHF: gemmaToHF,
    validate: validateGemma,
    create: (c, options) => new Gemma(c, options),
    blockWeights: gemmaBlockWeights,
    blockProfile: gemmaBlockProfile,
    // the family's default window, and hidden / heads per head
    small(s) {
      noWindow(s, type);
      const intermediate = s.intermediate ?? 4 * s.hidden;
      return gemmaConfig({ ...smallBase(s), modelType: type, kvHeads: s.kvHeads, headDim: s.hidden / s.heads, intermediate });
    },
  };
}

export const gemma2 = gemmaFamily('gemma2', 'gemma2');
export const gemma3Text = gemmaFamily('gemma3_text', 'gemma3');
