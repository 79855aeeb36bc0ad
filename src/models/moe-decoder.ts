import { InvalidArgumentError } from '../errors.ts';
import { Embedding, Linear, Module, ModuleList, RMSNorm } from '../nn/index.ts';
import { Generator, type Tensor } from '../tensor/index.ts';
import type { DecoderConfigBase, ModelConfig } from './config.ts';
import { firstId, num } from './config-fields.ts';
import { type BlockAttention, normalInit, proj } from './decoder-parts.ts';
import { decoderBlockWeights, DecoderAttention, type DecoderAttentionConfig } from './decoder.ts';
import { countParameters, type NamedShape } from './families/family.ts';
import { type ForwardContext, type LayerProfile, layerProfile,
  type ModelLayer, type ModelPart, type SectionParts } from './model.ts';
import { GatedMLP, type GatedMLPNames, type MoeSpec, moeSizes, PROJ_NAMES, SparseMoe } from './moe.ts';
import { cachedRotaryTables, type RopeScaling, ropeFromHF, type RopeSpec, ropeToHF } from './rope.ts';
import { DecoderLM, decoderLayers, plainEmbedding, sectionSetup } from './decoder-layers.ts';

/**
 * The decoder the sparse MoE families share: the shared decoder's blocks (RMSNorm,
 * rotary GQA attention, RMSNorm, MLP, residuals around each) with a sparse MoE block (moe.ts) as
 * the MLP, or on some blocks a dense SwiGLU. A family says how its blocks differ:
 * the MLP's module name, the attention's options (biases, q/k norms), each block's MLP.
 */

/** The fields the MoE families' configs share. */
export interface MoeDecoderConfig extends Omit<DecoderConfigBase, 'intermediate'> {
  kvHeads: number;
  headDim: number;
  ropeTheta: number;
  ropeScaling?: RopeScaling;
  /** A window on every block's attention (absent: none). */
  slidingWindow?: number;
  /** Experts per sparse block (num_local_experts or num_experts). */
  experts: number;
  /** Experts each token runs (num_experts_per_tok). */
  topK: number;
}

type Json = Record<string, unknown>;

/** What a family's config class defaults to where config.json leaves a field out. */
export interface MoeDefaults {
  maxPositions: number;
  normEps: number;
  ropeTheta: number;
  kvHeads: number;
}

/**
 * The shared fields of a MoE family's config.json, as transformers reads them; what the code does
 * not build is refused naming the field: an activation other than silu, and output_router_logits
 * (with labels, transformers adds the router's load-balancing loss to the loss).
 */
export function moeDecoderFromHF(raw: Json, type: string, d: MoeDefaults): MoeDecoderConfig {
  const act = raw.hidden_act ?? 'silu';
  if (act !== 'silu') throw new InvalidArgumentError(`${type} hidden_act '${String(act)}' is not supported (silu only)`);
  if (raw.output_router_logits === true) {
    throw new InvalidArgumentError(`${type} output_router_logits true is not supported (its load-balancing loss is added to the loss: false only)`);
  }
  const hidden = num(raw, 'hidden_size');
  const heads = num(raw, 'num_attention_heads');
  const { theta, scaling } = ropeFromHF(raw, d.ropeTheta);
  const c: MoeDecoderConfig = {
    vocabSize: num(raw, 'vocab_size'),
    maxPositions: num(raw, 'max_position_embeddings', d.maxPositions),
    hidden,
    layers: num(raw, 'num_hidden_layers'),
    heads,
    // an explicit null means as many as heads
    kvHeads: raw.num_key_value_heads === null ? heads : num(raw, 'num_key_value_heads', d.kvHeads),
    headDim: num(raw, 'head_dim', Math.floor(hidden / heads)),
    normEps: num(raw, 'rms_norm_eps', d.normEps),
    ropeTheta: theta,
    initializerRange: num(raw, 'initializer_range', 0.02),
    tieWordEmbeddings: raw.tie_word_embeddings === true,
    experts: 0,
    topK: num(raw, 'num_experts_per_tok', 2),
    bosTokenId: firstId(raw.bos_token_id),
    eosTokenId: firstId(raw.eos_token_id),
  };
  if (scaling) c.ropeScaling = scaling;
  return c;
}

/** The shared fields as config.json writes them (the family adds its own). */
export function moeDecoderToHF(c: MoeDecoderConfig): Json {
  return {
    vocab_size: c.vocabSize,
    max_position_embeddings: c.maxPositions,
    hidden_size: c.hidden,
    num_hidden_layers: c.layers,
    num_attention_heads: c.heads,
    num_key_value_heads: c.kvHeads,
    head_dim: c.headDim,
    hidden_act: 'silu',
    rms_norm_eps: c.normEps,
    rope_theta: c.ropeTheta,
    rope_scaling: ropeToHF(c.ropeScaling),
    initializer_range: c.initializerRange,
    tie_word_embeddings: c.tieWordEmbeddings,
    num_experts_per_tok: c.topK,
    output_router_logits: false,
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenId,
    torch_dtype: 'float32',
  };
}

/** The checks the MoE families share: heads, head dim, window, top-k. */
export function validateMoeDecoder(c: MoeDecoderConfig, type: string): void {
  if (!Number.isInteger(c.kvHeads) || c.kvHeads <= 0 || c.heads % c.kvHeads !== 0) throw new InvalidArgumentError(`${c.heads} heads are not a multiple of ${c.kvHeads} kv heads`);
  if (!Number.isInteger(c.headDim) || c.headDim <= 0 || c.headDim % 2 !== 0) throw new InvalidArgumentError(`head dim ${c.headDim} must be a positive even integer`);
  if (c.slidingWindow !== undefined && (!Number.isInteger(c.slidingWindow) || c.slidingWindow <= 0)) {
    throw new InvalidArgumentError(`sliding_window must be a positive integer, got ${c.slidingWindow}`);
  }
  if (!Number.isInteger(c.experts) || c.experts < 0 || c.experts > 65536) throw new InvalidArgumentError(`${type} has ${c.experts} experts: 0 to 65536`);
  if (c.experts > 0 && (!Number.isInteger(c.topK) || c.topK < 1 || c.topK > c.experts)) {
    throw new InvalidArgumentError(`${type} num_experts_per_tok ${c.topK} must be from 1 to its ${c.experts} experts`);
  }
}

/** A config.json window: null or absent (after `fallback`) for none, else a positive integer. */
export function windowFromHF(raw: Json, fallback: number | null): number | undefined {
  const w = Object.hasOwn(raw, 'sliding_window') ? raw.sliding_window : fallback;
  if (w === null || w === undefined) return undefined;
  if (typeof w !== 'number' || !Number.isInteger(w) || w <= 0) throw new InvalidArgumentError(`config.json sliding_window must be a positive integer or null, got ${JSON.stringify(w)}`);
  return w;
}

/** A block's MLP: a sparse MoE block, or a dense SwiGLU of some width. */
export type BlockMlp = { sparse: MoeSpec } | { dense: number };

/** How a family's blocks are made. */
export interface MoeFamily {
  /** The MLP's module name in a block (`block_sparse_moe`, `mlp`). */
  mlpName: string;
  attention: DecoderAttentionConfig;
  /** Block i's MLP. */
  mlp(i: number): BlockMlp;
}

/**
 * The checkpoint names and shapes of a MoE family's block i (after `model.layers.N.`): the shared attention and norms,
 * then its MLP: a router and each expert's SwiGLU, or a dense SwiGLU.
 */
export function moeBlockWeights(c: MoeDecoderConfig, family: MoeFamily, i: number): NamedShape[] {
  const h = c.hidden;
  const shared = decoderBlockWeights({ ...family.attention, intermediate: 0 }).filter(([name]) => !name.startsWith('mlp.'));
  const mlp = family.mlp(i);
  const m = family.mlpName;
  const swiglu = (prefix: string, width: number, names: GatedMLPNames): NamedShape[] => [
    [`${prefix}.${names.gate}.weight`, [width, h]],
    [`${prefix}.${names.up}.weight`, [width, h]],
    [`${prefix}.${names.down}.weight`, [h, width]],
  ];
  if (!('sparse' in mlp)) return [...shared, ...swiglu(m, mlp.dense, PROJ_NAMES)];
  const s = mlp.sparse;
  const experts = Array.from({ length: s.experts }, (_, e) => swiglu(`${m}.experts.${e}`, s.width, s.names));
  return [...shared, [`${m}.gate.weight`, [s.experts, h]], ...experts.flat()];
}

/**
 * A MoE family's block i profile: every expert's parameters (counted from its checkpoint names), the FLOPs of the
 * experts a token runs (top-k).
 */
export function moeBlockProfile(c: MoeDecoderConfig, family: MoeFamily, i: number): LayerProfile {
  const h = c.hidden;
  const weights = moeBlockWeights(c, family, i);
  const params = countParameters(weights);
  const attention = params - countParameters(weights.filter(([name]) => name.startsWith(`${family.mlpName}.`)));
  const mlp = family.mlp(i);
  const flopsPerToken = 'sparse' in mlp ? moeSizes(mlp.sparse).flopsPerToken : 6 * h * mlp.dense;
  return layerProfile(params, 2 * attention + flopsPerToken, h, 4 * c.heads * c.headDim, 2 * c.kvHeads * c.headDim);
}

export class MoeDecoderLayer extends Module {
  readonly input_layernorm: RMSNorm;
  readonly self_attn: DecoderAttention;
  readonly post_attention_layernorm: RMSNorm;
  readonly mlp: SparseMoe | GatedMLP;
  private readonly options: BlockAttention['options'];
  constructor(
    c: MoeDecoderConfig,
    family: MoeFamily,
    blockIndex: number,
    private readonly rope: RopeSpec,
    private readonly ropeKey: string,
    rng: Generator,
  ) {
    super();
    this.input_layernorm = this.addModule('input_layernorm', new RMSNorm(c.hidden, c.normEps));
    this.self_attn = this.addModule('self_attn', new DecoderAttention(family.attention, rng));
    this.post_attention_layernorm = this.addModule('post_attention_layernorm', new RMSNorm(c.hidden, c.normEps));
    const mlp = family.mlp(blockIndex);
    this.mlp = this.addModule(family.mlpName, 'sparse' in mlp ? new SparseMoe(mlp.sparse, rng) : new GatedMLP(c.hidden, mlp.dense, PROJ_NAMES, c, rng));
    this.options = c.slidingWindow === undefined ? {} : { window: c.slidingWindow };
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    const at: BlockAttention = { rope: cachedRotaryTables(ctx.positions, this.rope, this.ropeKey), options: this.options };
    x = x.add(this.self_attn.forward(this.input_layernorm.forward(x), ctx, blockIndex, at));
    return x.add(this.mlp.forward(this.post_attention_layernorm.forward(x)));
  }
}

class MoeModel extends Module {
  readonly embed_tokens: Embedding | null;
  readonly layers: ModuleList<MoeDecoderLayer>;
  readonly norm: RMSNorm | null;
  constructor(c: MoeDecoderConfig, family: MoeFamily, rng: Generator, parts: SectionParts) {
    super();
    this.embed_tokens = parts.tokenTable ? this.addModule('embed_tokens', new Embedding(c.vocabSize, c.hidden, { rng })) : null;
    if (this.embed_tokens) normalInit(this.embed_tokens, c.initializerRange, rng);
    const rope: RopeSpec = { theta: c.ropeTheta, rotaryDim: c.headDim, maxPositions: c.maxPositions };
    if (c.ropeScaling) rope.scaling = c.ropeScaling;
    const ropeKey = JSON.stringify(rope);
    const [first, last] = parts.blocks;
    const blocks = Array.from({ length: last - first }, (_, i) => new MoeDecoderLayer(c, family, first + i, rope, ropeKey, rng));
    this.layers = this.addModule('layers', new ModuleList(blocks, first));
    this.norm = parts.norm ? this.addModule('norm', new RMSNorm(c.hidden, c.normEps)) : null;
  }
}

/** A MoE family's causal LM: `model` and `lm_head`. */
export class MoeForCausalLM<C extends ModelConfig & MoeDecoderConfig> extends DecoderLM {
  readonly model: MoeModel;
  readonly lm_head: Linear | null;

  /** @param options.section build only layers [start, end), uninitialised (see sectionSetup). */
  constructor(
    readonly config: C,
    private readonly family: MoeFamily,
    options: { seed?: number; init?: boolean; section?: ModelPart } = {},
  ) {
    super();
    const { parts, section, rng } = sectionSetup(config.layers, config.tieWordEmbeddings, options);
    this.section = section;
    this.model = this.addModule('model', new MoeModel(config, family, rng, parts));
    this.lm_head
      = !config.tieWordEmbeddings && parts.head ? this.addModule('lm_head', proj(config.hidden, config.vocabSize, false, config, rng)) : null;
    this.setLayers(this.buildLayers());
  }

  private buildLayers(): ModelLayer[] {
    const c = this.config;
    const m = this.model;
    const h = c.hidden;
    const headWeight = () => this.lm_head?.weight ?? m.embed_tokens!.weight;
    const headName = c.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
    return decoderLayers({
      blocks: c.layers, hidden: h, vocab: c.vocabSize,
      embedding: plainEmbedding('model.embed_tokens', () => m.embed_tokens!, c.vocabSize, h),
      blockPrefix: 'model.layers',
      block: (i) => m.layers.byIndex(i),
      blockProfile: (i) => moeBlockProfile(c, this.family, i),
      norm: { name: 'model.norm', module: () => m.norm!, params: h },
      head: { name: 'lm_head', weightName: headName, weight: headWeight },
    });
  }
}
