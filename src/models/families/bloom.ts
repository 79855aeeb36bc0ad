import { InvalidArgumentError } from '../../errors.ts';
import { denseBlockProfile, type Family, layerNormWeights, linearWeights, multiHead, type NamedShape, noWindow, shellLayout, smallBase } from './family.ts';
import { LayerNorm, type Linear, Module } from '../../nn/index.ts';
import { Generator, type Tensor } from '../../tensor/index.ts';
import { alibiAttention, alibiSlopes } from '../alibi.ts';
import { firstId, num } from '../config-fields.ts';
import { mergeHeads } from '../forward.ts';
import { type ForwardContext, type LayerProfile } from '../model.ts';
import { GeluMLP, proj } from '../decoder-parts.ts';
import { type ShellOptions, ShellLM, type ShellSpec } from '../decoder-shell.ts';
import type { DecoderConfigBase } from '../config.ts';

/**
 * BLOOM as transformers' BloomForCausalLM: no position embeddings but ALiBi biases in every
 * attention; a LayerNorm right after the token embedding (word_embeddings_layernorm, part of
 * the embedding layer here); a fused query_key_value laid out head by head ([q, k, v] of head 0,
 * then head 1, …); sequential pre-LayerNorm blocks whose residual is added inside the attention
 * and the MLP; a tanh-GELU MLP of 4 × hidden; the head tied to the embedding.
 */
export interface BloomConfig extends DecoderConfigBase {
  arch: 'bloom';
  /**
   * Longest sequence accepted (ALiBi itself has no limit; BLOOM has no such key, its models
   * were trained on 2048: `max_position_embeddings` here, written only when it differs).
   */
  /** apply_residual_connection_post_layernorm: the residual is the normed input (false). */
  residualPostNorm: boolean;
  padTokenId?: number;
}

const BLOOM_MAX_POSITIONS = 2048;

/** BLOOM-560M's shape unless overridden. */
export function bloomConfig(overrides: Partial<Omit<BloomConfig, 'arch' | 'intermediate'>> = {}): BloomConfig {
  const hidden = overrides.hidden ?? 1024;
  return {
    arch: 'bloom',
    vocabSize: 250880,
    maxPositions: BLOOM_MAX_POSITIONS,
    layers: 24,
    heads: 16,
    normEps: 1e-5,
    initializerRange: 0.02,
    tieWordEmbeddings: true,
    residualPostNorm: false,
    bosTokenId: 1,
    eosTokenId: 2,
    padTokenId: 3,
    ...overrides,
    hidden,
    intermediate: 4 * hidden,
  };
}

/** Throws InvalidArgumentError naming what does not fit. */
export function validateBloom(c: BloomConfig): void {
  if (c.hidden % c.heads !== 0) throw new InvalidArgumentError(`BLOOM hidden size ${c.hidden} is not divisible by ${c.heads} heads`);
  if (c.intermediate !== 4 * c.hidden) throw new InvalidArgumentError(`BLOOM's MLP is 4 × hidden = ${4 * c.hidden} wide, not ${c.intermediate}`);
}

/** Reads a `model_type: bloom` config.json (n_embed, n_layer, n_head, or their long names). */
export function bloomFromHF(raw: Record<string, unknown>): BloomConfig {
  const tp = raw.pretraining_tp ?? 1;
  if (raw.slow_but_exact === true && typeof tp === 'number' && tp > 1) {
    throw new InvalidArgumentError(`BLOOM 'slow_but_exact: true' with pretraining_tp ${tp} (sliced linears) is not supported`);
  }
  const alias = (key: string, long: string) => num(raw, key, typeof raw[long] === 'number' ? raw[long] : undefined);
  const c = bloomConfig({
    vocabSize: num(raw, 'vocab_size'),
    maxPositions: num(raw, 'max_position_embeddings', BLOOM_MAX_POSITIONS),
    hidden: num(raw, 'hidden_size', typeof raw.n_embed === 'number' ? raw.n_embed : undefined),
    layers: alias('n_layer', 'num_hidden_layers'),
    heads: alias('n_head', 'num_attention_heads'),
    normEps: num(raw, 'layer_norm_epsilon', 1e-5),
    initializerRange: num(raw, 'initializer_range', 0.02),
    tieWordEmbeddings: raw.tie_word_embeddings !== false,
    residualPostNorm: raw.apply_residual_connection_post_layernorm === true,
    bosTokenId: firstId(raw.bos_token_id),
    eosTokenId: firstId(raw.eos_token_id),
    padTokenId: firstId(raw.pad_token_id),
  });
  validateBloom(c);
  return c;
}

export function bloomToHF(c: BloomConfig): Record<string, unknown> {
  return {
    architectures: ['BloomForCausalLM'],
    model_type: 'bloom',
    vocab_size: c.vocabSize,
    ...(c.maxPositions === BLOOM_MAX_POSITIONS ? {} : { max_position_embeddings: c.maxPositions }),
    hidden_size: c.hidden,
    n_layer: c.layers,
    n_head: c.heads,
    layer_norm_epsilon: c.normEps,
    initializer_range: c.initializerRange,
    apply_residual_connection_post_layernorm: c.residualPostNorm,
    tie_word_embeddings: c.tieWordEmbeddings,
    hidden_dropout: 0,
    attention_dropout: 0,
    pretraining_tp: 1,
    slow_but_exact: false,
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenId,
    pad_token_id: c.padTokenId,
    torch_dtype: 'float32',
  };
}

class BloomAttention extends Module {
  readonly query_key_value: Linear;
  readonly dense: Linear;
  private readonly slopes: Float32Array;
  constructor(
    private readonly c: BloomConfig,
    rng: Generator,
  ) {
    super();
    this.query_key_value = this.addModule('query_key_value', proj(c.hidden, 3 * c.hidden, true, c, rng));
    this.dense = this.addModule('dense', proj(c.hidden, c.hidden, true, c, rng));
    this.slopes = alibiSlopes(c.heads);
  }

  /** The attention's output plus `residual`, as BLOOM adds it. */
  forward(x: Tensor, residual: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    const [b, t] = x.shape;
    const nh = this.c.heads;
    const hd = this.c.hidden / nh;
    // per head: [q, k, v], each hd wide
    const [q, k, v] = this.query_key_value.forward(x).reshape([b, t, nh, 3, hd]).split(1, 3); // 3 × [B, T, nh, 1, hd]
    const heads = (u: Tensor) => u.reshape([b, t, nh, hd]).transpose(1, 2); // [B, nh, T, hd]
    const y = alibiAttention(heads(q), heads(k), heads(v), ctx, blockIndex, this.slopes, 1 / Math.sqrt(hd)); // [B, nh, T, hd]
    return residual.add(this.dense.forward(mergeHeads(y))); // [B, T, H]
  }
}

export class BloomBlock extends Module {
  readonly input_layernorm: LayerNorm;
  readonly self_attention: BloomAttention;
  readonly post_attention_layernorm: LayerNorm;
  readonly mlp: GeluMLP;
  constructor(
    private readonly c: BloomConfig,
    rng: Generator,
  ) {
    super();
    this.input_layernorm = this.addModule('input_layernorm', new LayerNorm(c.hidden, c.normEps));
    this.self_attention = this.addModule('self_attention', new BloomAttention(c, rng));
    this.post_attention_layernorm = this.addModule('post_attention_layernorm', new LayerNorm(c.hidden, c.normEps));
    this.mlp = this.addModule('mlp', new GeluMLP(c, true, 'tanh', rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    const ln1 = this.input_layernorm.forward(x);
    const h = this.self_attention.forward(ln1, this.c.residualPostNorm ? ln1 : x, ctx, blockIndex);
    const ln2 = this.post_attention_layernorm.forward(h);
    return (this.c.residualPostNorm ? ln2 : h).add(this.mlp.forward(ln2));
  }
}

/** BLOOM's decoder shell: a LayerNorm after the token table (part of the embedding layer), no learned positions. */
const BLOOM_SHELL: ShellSpec<BloomConfig, BloomBlock> = {
  names: { prefix: 'transformer', table: 'word_embeddings', tableNorm: 'word_embeddings_layernorm', blocks: 'h', norm: 'ln_f', head: 'lm_head' },
  validate: validateBloom,
  block: (c, rng) => new BloomBlock(c, rng),
  blockProfile: bloomBlockProfile,
};

export class Bloom extends ShellLM<BloomConfig, BloomBlock> {
  /** @param options.section build only layers [start, end), uninitialised (see sectionSetup). */
  constructor(config: BloomConfig, options: ShellOptions = {}) {
    super(config, options, BLOOM_SHELL);
  }
}

/** A BLOOM block's weights: two layer norms, the fused q/k/v, dense and the MLP, all biased. */
function bloomBlockWeights(c: BloomConfig): NamedShape[] {
  const h = c.hidden;
  return [
    ...layerNormWeights('input_layernorm', h),
    ...linearWeights('self_attention.query_key_value', h, 3 * h, true),
    ...linearWeights('self_attention.dense', h, h, true),
    ...layerNormWeights('post_attention_layernorm', h),
    ...linearWeights('mlp.dense_h_to_4h', h, c.intermediate, true),
    ...linearWeights('mlp.dense_4h_to_h', c.intermediate, h, true),
  ];
}

/** A bloom block's profile for the planner, from its weights. */
function bloomBlockProfile(c: BloomConfig): LayerProfile {
  return denseBlockProfile(bloomBlockWeights(c), c.hidden, c.hidden, c.hidden);
}

export const bloom: Family<BloomConfig> = {
  name: 'bloom',
  architecture: 'BloomForCausalLM',
  fixtures: ['bloom'],
  layout: shellLayout(BLOOM_SHELL.names),
  owns: (c) => c.arch === 'bloom',
  fromHF: bloomFromHF,
  toHF: bloomToHF,
  validate: validateBloom,
  create: (c, options) => new Bloom(c, options),
  blockWeights: bloomBlockWeights,
  blockProfile: bloomBlockProfile,
  small(s) {
    noWindow(s, 'bloom');
    if (s.intermediate !== undefined && s.intermediate !== 4 * s.hidden) {
      throw new InvalidArgumentError(`BLOOM's MLP is 4 × --hidden wide, not --intermediate ${s.intermediate}`);
    }
    multiHead(s);
    return bloomConfig({ ...smallBase(s), padTokenId: undefined });
  },
};
