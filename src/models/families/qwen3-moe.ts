import { InvalidArgumentError } from '../../errors.ts';
import { num } from '../config-fields.ts';
import { type MoeDecoderConfig, moeDecoderFromHF, moeDecoderToHF, moeBlockProfile, moeBlockWeights, type MoeFamily, MoeForCausalLM, validateMoeDecoder, windowFromHF } from '../moe-decoder.ts';
import type { ModelPart } from '../model.ts';
import { DECODER_LAYOUT } from '../decoder-config.ts';
import { type Family, noWindow, smallBase } from './family.ts';
import { PROJ_NAMES } from '../moe.ts';

/**
 * Qwen3-MoE as transformers' Qwen3MoeForCausalLM: Qwen3's attention (per-head q/k RMSNorms,
 * attention_bias on q, k, v and o) with a sparse MoE block as the MLP, `mlp`: a router picks each
 * token's top-k of num_experts, their probabilities renormalised only with norm_topk_prob; each
 * expert a SwiGLU named gate_proj, up_proj, down_proj. A block is sparse unless mlp_only_layers
 * lists it or its number (index + 1) is not a multiple of decoder_sparse_step; the others have a
 * dense SwiGLU of intermediate_size. use_sliding_window puts sliding_window on every block.
 */

export interface Qwen3MoeConfig extends MoeDecoderConfig {
  arch: 'qwen3_moe';
  /** The dense blocks' SwiGLU width (intermediate_size). */
  intermediate: number;
  /** Each expert's SwiGLU width (moe_intermediate_size). */
  moeIntermediate: number;
  /** Renormalise the top-k probabilities to sum to 1 (norm_topk_prob). */
  normTopK: boolean;
  /** Biases on q, k, v and o (attention_bias). */
  attentionBias: boolean;
  /** Blocks with a dense MLP whatever the step (mlp_only_layers). */
  mlpOnlyLayers: number[];
  /** Every decoder_sparse_step-th block is sparse (1: all). */
  decoderSparseStep: number;
}

/** A Qwen3-MoE config.json as a Qwen3MoeConfig (not yet validated). */
export function qwen3MoeFromHF(raw: Record<string, unknown>): Qwen3MoeConfig {
  const only = raw.mlp_only_layers ?? [];
  if (!Array.isArray(only) || only.some((i) => !Number.isInteger(i))) {
    throw new InvalidArgumentError(`config.json mlp_only_layers must be a list of layer indices, got ${JSON.stringify(only)}`);
  }
  const c: Qwen3MoeConfig = {
    arch: 'qwen3_moe',
    ...moeDecoderFromHF(raw, 'qwen3_moe', { maxPositions: 32768, normEps: 1e-6, ropeTheta: 10000, kvHeads: 4 }),
    intermediate: num(raw, 'intermediate_size', 6144),
    moeIntermediate: num(raw, 'moe_intermediate_size', 768),
    experts: num(raw, 'num_experts', num(raw, 'num_local_experts', 128)),
    normTopK: raw.norm_topk_prob === true,
    attentionBias: raw.attention_bias === true,
    mlpOnlyLayers: only as number[],
    decoderSparseStep: num(raw, 'decoder_sparse_step', 1),
  };
  // transformers keeps the window only with use_sliding_window (max_window_layers is not read)
  const window = raw.use_sliding_window === true ? windowFromHF(raw, 4096) : undefined;
  if (window !== undefined) c.slidingWindow = window;
  return c;
}

/** A Qwen3-MoE config as the config.json transformers reads back into the same model. */
export function qwen3MoeToHF(c: Qwen3MoeConfig): Record<string, unknown> {
  return {
    architectures: ['Qwen3MoeForCausalLM'],
    model_type: 'qwen3_moe',
    ...moeDecoderToHF(c),
    intermediate_size: c.intermediate,
    moe_intermediate_size: c.moeIntermediate,
    num_experts: c.experts,
    norm_topk_prob: c.normTopK,
    attention_bias: c.attentionBias,
    mlp_only_layers: c.mlpOnlyLayers,
    decoder_sparse_step: c.decoderSparseStep,
    use_sliding_window: c.slidingWindow !== undefined,
    sliding_window: c.slidingWindow ?? null,
  };
}

export function validateQwen3Moe(c: Qwen3MoeConfig): void {
  validateMoeDecoder(c, 'qwen3_moe');
  if (!Number.isInteger(c.moeIntermediate) || c.moeIntermediate <= 0 || c.moeIntermediate > 1_048_576) {
    throw new InvalidArgumentError(`qwen3_moe moe_intermediate_size must be a positive integer up to 1048576, got ${c.moeIntermediate}`);
  }
  if (!Number.isInteger(c.decoderSparseStep) || c.decoderSparseStep < 1) {
    throw new InvalidArgumentError(`qwen3_moe decoder_sparse_step must be a positive integer, got ${c.decoderSparseStep}`);
  }
  const outside = c.mlpOnlyLayers.find((i) => !Number.isInteger(i) || i < 0 || i >= c.layers);
  if (outside !== undefined) throw new InvalidArgumentError(`qwen3_moe mlp_only_layers names layer ${outside}, not one of its ${c.layers}`);
}

/** Whether block `i` is sparse, as Qwen3MoeDecoderLayer decides. */
export function qwen3MoeSparse(c: Qwen3MoeConfig, i: number): boolean {
  return !c.mlpOnlyLayers.includes(i) && c.experts > 0 && (i + 1) % c.decoderSparseStep === 0;
}

/** A small Qwen3-MoE (8 experts of which 2 run per token, renormalised; overrides change any field). */
export function qwen3MoeConfig(overrides: Partial<Omit<Qwen3MoeConfig, 'arch'>> = {}): Qwen3MoeConfig {
  const hidden = overrides.hidden ?? 128;
  const heads = overrides.heads ?? 4;
  return {
    arch: 'qwen3_moe',
    vocabSize: 151936,
    maxPositions: 4096,
    layers: 4,
    intermediate: 4 * hidden,
    moeIntermediate: hidden,
    normEps: 1e-6,
    ropeTheta: 1e6,
    initializerRange: 0.02,
    tieWordEmbeddings: false,
    experts: 8,
    topK: 2,
    normTopK: true,
    attentionBias: false,
    mlpOnlyLayers: [],
    decoderSparseStep: 1,
    bosTokenId: 151643,
    eosTokenId: 151645,
    ...overrides,
    hidden,
    heads,
    kvHeads: overrides.kvHeads ?? heads,
    headDim: overrides.headDim ?? hidden / heads,
  };
}

/** Qwen3-MoE's blocks: q/k norms, `mlp` sparse (experts named as the shared decoder's MLP) or dense. */
function qwen3MoeFamily(c: Qwen3MoeConfig): MoeFamily {
  const sparse = {
    hidden: c.hidden,
    width: c.moeIntermediate,
    experts: c.experts,
    topK: c.topK,
    normTopK: c.normTopK,
    names: PROJ_NAMES,
    initializerRange: c.initializerRange,
  };
  return {
    mlpName: 'mlp',
    attention: { ...c, qkvBias: c.attentionBias, oBias: c.attentionBias, qkNorm: true },
    mlp: (i) => (qwen3MoeSparse(c, i) ? { sparse } : { dense: c.intermediate }),
  };
}

export class Qwen3Moe extends MoeForCausalLM<Qwen3MoeConfig> {
  /** @param options.section build only layers [start, end), uninitialised (see sectionSetup). */
  constructor(config: Qwen3MoeConfig, options: { seed?: number; init?: boolean; section?: ModelPart } = {}) {
    super(config, qwen3MoeFamily(config), options);
  }
}

export const qwen3Moe: Family<Qwen3MoeConfig> = {
  name: 'qwen3_moe',
  architecture: 'Qwen3MoeForCausalLM',
  fixtures: ['qwen3_moe'],
  layout: DECODER_LAYOUT,
  owns: (c) => c.arch === 'qwen3_moe',
  fromHF: qwen3MoeFromHF,
  toHF: qwen3MoeToHF,
  validate: validateQwen3Moe,
  create: (c, options) => new Qwen3Moe(c, options),
  blockWeights: (c, i) => moeBlockWeights(c, qwen3MoeFamily(c), i),
  blockProfile: (c, i) => moeBlockProfile(c, qwen3MoeFamily(c), i),
  // 8 experts of --intermediate width, 2 run per token
  small(s) {
    noWindow(s, 'qwen3_moe');
    return qwen3MoeConfig({ ...smallBase(s), kvHeads: s.kvHeads, moeIntermediate: s.intermediate ?? s.hidden, intermediate: 4 * s.hidden });
  },
};
