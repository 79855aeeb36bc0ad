import { InvalidArgumentError } from '../../errors.ts';
import { num } from '../config-fields.ts';
import { type MoeDecoderConfig, moeDecoderFromHF, moeDecoderToHF, moeBlockProfile, moeBlockWeights, type MoeFamily, MoeForCausalLM, validateMoeDecoder, windowFromHF } from '../moe-decoder.ts';
import type { ModelPart } from '../model.ts';
import { DECODER_LAYOUT } from '../decoder-config.ts';
import { type Family, noWindow, smallBase } from './family.ts';

/**
 * Mixtral as transformers' MixtralForCausalLM: the shared decoder's blocks (GQA, rotary, an optional
 * sliding window on every block) with a sparse MoE block for the MLP, `block_sparse_moe`: a
 * router picks each token's top-k experts of num_local_experts, their probabilities always
 * renormalised; each expert a SwiGLU named w1 (gate), w3 (up), w2 (down).
 */

export interface MixtralConfig extends MoeDecoderConfig {
  arch: 'mixtral';
  /** Each expert's SwiGLU width (intermediate_size). */
  intermediate: number;
}

/** A Mixtral config.json as a MixtralConfig (not yet validated). */
export function mixtralFromHF(raw: Record<string, unknown>): MixtralConfig {
  const jitter = raw.router_jitter_noise ?? 0;
  if (jitter !== 0) throw new InvalidArgumentError(`mixtral router_jitter_noise ${String(jitter)} is not supported (0 only: it scales the inputs by noise in training)`);
  const c: MixtralConfig = {
    arch: 'mixtral',
    ...moeDecoderFromHF(raw, 'mixtral', { maxPositions: 4096 * 32, normEps: 1e-5, ropeTheta: 1e6, kvHeads: 8 }),
    intermediate: num(raw, 'intermediate_size', 14336),
    experts: num(raw, 'num_local_experts', 8),
  };
  const window = windowFromHF(raw, null);
  if (window !== undefined) c.slidingWindow = window;
  return c;
}

/** A Mixtral config as the config.json transformers reads back into the same model. */
export function mixtralToHF(c: MixtralConfig): Record<string, unknown> {
  return {
    architectures: ['MixtralForCausalLM'],
    model_type: 'mixtral',
    ...moeDecoderToHF(c),
    intermediate_size: c.intermediate,
    num_local_experts: c.experts,
    sliding_window: c.slidingWindow ?? null,
  };
}

export function validateMixtral(c: MixtralConfig): void {
  validateMoeDecoder(c, 'mixtral');
  if (c.experts < 1) throw new InvalidArgumentError(`mixtral num_local_experts must be at least 1, got ${c.experts}`);
}

/** A small Mixtral (4 experts of which 2 run per token; overrides change any field). */
export function mixtralConfig(overrides: Partial<Omit<MixtralConfig, 'arch'>> = {}): MixtralConfig {
  const hidden = overrides.hidden ?? 128;
  const heads = overrides.heads ?? 4;
  return {
    arch: 'mixtral',
    vocabSize: 32000,
    maxPositions: 4096,
    layers: 4,
    intermediate: 2 * hidden,
    normEps: 1e-5,
    ropeTheta: 1e6,
    initializerRange: 0.02,
    tieWordEmbeddings: false,
    experts: 4,
    topK: 2,
    bosTokenId: 1,
    eosTokenId: 2,
    ...overrides,
    hidden,
    heads,
    kvHeads: overrides.kvHeads ?? heads,
    headDim: overrides.headDim ?? hidden / heads,
  };
}

/** Mixtral's blocks: attention without biases, `block_sparse_moe` with experts named w1, w3, w2. */
function mixtralFamily(c: MixtralConfig): MoeFamily {
  const sparse = {
    hidden: c.hidden,
    width: c.intermediate,
    experts: c.experts,
    topK: c.topK,
    normTopK: true,
    names: { gate: 'w1', up: 'w3', down: 'w2' },
    initializerRange: c.initializerRange,
  };
  return {
    mlpName: 'block_sparse_moe',
    attention: { ...c, qkvBias: false, oBias: false },
    mlp: () => ({ sparse }),
  };
}

export class Mixtral extends MoeForCausalLM<MixtralConfig> {
  /** @param options.section build only layers [start, end), uninitialised (see sectionSetup). */
  constructor(config: MixtralConfig, options: { seed?: number; init?: boolean; section?: ModelPart } = {}) {
    super(config, mixtralFamily(config), options);
  }
}

export const mixtral: Family<MixtralConfig> = {
  name: 'mixtral',
  architecture: 'MixtralForCausalLM',
  fixtures: ['mixtral'],
  layout: DECODER_LAYOUT,
  owns: (c) => c.arch === 'mixtral',
  fromHF: mixtralFromHF,
  toHF: mixtralToHF,
  validate: validateMixtral,
  create: (c, options) => new Mixtral(c, options),
  blockWeights: (c, i) => moeBlockWeights(c, mixtralFamily(c), i),
  blockProfile: (c, i) => moeBlockProfile(c, mixtralFamily(c), i),
  // 4 experts of --intermediate width, 2 run per token
  small(s) {
    noWindow(s, 'mixtral');
    return mixtralConfig({ ...smallBase(s), kvHeads: s.kvHeads, intermediate: s.intermediate ?? 2 * s.hidden });
  },
};
