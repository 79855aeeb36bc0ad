import { InvalidArgumentError } from '../../errors.ts';
import { denseBlockProfile, type Family, layerNormWeights, linearWeights, type NamedShape, noWindow, shellLayout, smallBase } from './family.ts';
import { LayerNorm, type Linear, Module } from '../../nn/index.ts';
import { Generator, type Tensor } from '../../tensor/index.ts';
import { firstId, num } from '../config-fields.ts';
import { cachedAttention, mergeHeads } from '../forward.ts';
import { type ForwardContext, type LayerProfile } from '../model.ts';
import { applyRotary, cachedRotaryTables, type RopeScaling, ropeFromHF, type RopeSpec, ropeToHF } from '../rope.ts';
import { GeluMLP, proj } from '../decoder-parts.ts';
import { type ShellOptions, ShellLM, type ShellSpec } from '../decoder-shell.ts';
import type { DecoderConfigBase } from '../config.ts';

/**
 * Falcon as transformers' FalconForCausalLM, in its two rotary forms:
 * - the new decoder architecture (Falcon-40B/180B, Falcon 2): grouped-query attention whose
 *   fused query_key_value holds, for each key/value head, its query heads, then its key, then its
 *   value; attention and MLP side by side, each after its own LayerNorm (ln_attn, ln_mlp), or
 *   both after input_layernorm when `num_ln_in_parallel_attn` is 1;
 * - the older multi-query architecture (Falcon-7B): every query head, then one key and one value
 *   head; attention and MLP side by side after input_layernorm.
 * Either way a block is x + (mlp(…) + attn(…)), the MLP is GELU (exact), the head tied by default.
 * Refused: ALiBi (Falcon-RW), sequential blocks (`parallel_attn: false`), multi-head attention
 * without the new architecture.
 */
export interface FalconConfig extends DecoderConfigBase {
  arch: 'falcon';
  /** Key/value heads: num_kv_heads under the new architecture, 1 under multi-query. */
  kvHeads: number;
  /** new_decoder_architecture (grouped layout) or the multi-query layout. */
  newDecoderArchitecture: boolean;
  /** LayerNorms of a block: 2 (ln_attn, ln_mlp) or 1 (input_layernorm for both). */
  parallelNorms: 1 | 2;
  /** Bias on every linear of a block (bias, false). */
  bias: boolean;
  ropeTheta: number;
  /** rope_scaling (linear, dynamic, yarn, llama3, see rope.ts); absent: the plain rotary. */
  ropeScaling?: RopeScaling;
}

/** Falcon-7B's shape (multi-query) unless overridden. */
export function falconConfig(overrides: Partial<Omit<FalconConfig, 'arch'>> = {}): FalconConfig {
  const hidden = overrides.hidden ?? 4544;
  const newArch = overrides.newDecoderArchitecture ?? false;
  return {
    arch: 'falcon',
    vocabSize: 65024,
    maxPositions: 2048,
    layers: 32,
    heads: 71,
    newDecoderArchitecture: newArch,
    bias: false,
    ropeTheta: 10000,
    normEps: 1e-5,
    initializerRange: 0.02,
    tieWordEmbeddings: true,
    bosTokenId: 11,
    eosTokenId: 11,
    ...overrides,
    hidden,
    kvHeads: overrides.kvHeads ?? (newArch ? (overrides.heads ?? 71) : 1),
    intermediate: overrides.intermediate ?? 4 * hidden,
    parallelNorms: overrides.parallelNorms ?? (newArch ? 2 : 1),
  };
}

/** Throws InvalidArgumentError naming what does not fit. */
export function validateFalcon(c: FalconConfig): void {
  if (c.hidden % c.heads !== 0) throw new InvalidArgumentError(`Falcon hidden size ${c.hidden} is not divisible by ${c.heads} heads`);
  if ((c.hidden / c.heads) % 2 !== 0) throw new InvalidArgumentError(`Falcon head dim ${c.hidden / c.heads} must be even for rotary embeddings`);
  if (!Number.isInteger(c.kvHeads) || c.kvHeads <= 0 || c.heads % c.kvHeads !== 0) {
    throw new InvalidArgumentError(`Falcon's ${c.heads} heads are not a multiple of ${c.kvHeads} kv heads`);
  }
  if (!c.newDecoderArchitecture && (c.kvHeads !== 1 || c.parallelNorms !== 1)) {
    throw new InvalidArgumentError('Falcon without new_decoder_architecture is multi-query (1 kv head) with input_layernorm only');
  }
}

/** Reads a `model_type: falcon` config.json (RefinedWeb's older names for it included). */
export function falconFromHF(raw: Record<string, unknown>): FalconConfig {
  const refuse = (what: string): never => {
    throw new InvalidArgumentError(`Falcon ${what} is not supported`);
  };
  if (raw.alibi === true) refuse('\'alibi: true\' (ALiBi, Falcon-RW)');
  if (raw.parallel_attn === false) refuse('\'parallel_attn: false\' (sequential blocks)');
  const rope = ropeFromHF(raw);
  const act = raw.activation ?? 'gelu';
  if (act !== 'gelu') refuse(`activation '${String(act)}' (gelu only)`);
  const newArch = raw.new_decoder_architecture === true;
  const heads = num(raw, 'num_attention_heads');
  let kvHeads: number;
  if (newArch) kvHeads = num(raw, 'num_kv_heads', heads);
  else if (raw.multi_query !== false) kvHeads = 1;
  else throw new InvalidArgumentError('Falcon \'multi_query: false\' without \'new_decoder_architecture\' (multi-head attention) is not supported');
  const lns = raw.num_ln_in_parallel_attn ?? (newArch ? 2 : 1);
  if (lns !== 1 && lns !== 2) refuse(`num_ln_in_parallel_attn ${JSON.stringify(lns)}`);
  if (!newArch && lns !== 1) refuse(`num_ln_in_parallel_attn ${String(lns)} without new_decoder_architecture`);
  const hidden = num(raw, 'hidden_size', typeof raw.n_embed === 'number' ? raw.n_embed : undefined);
  const c = falconConfig({
    vocabSize: num(raw, 'vocab_size'),
    maxPositions: num(raw, 'max_position_embeddings', 2048),
    hidden,
    layers: num(raw, 'num_hidden_layers', typeof raw.n_layer === 'number' ? raw.n_layer : undefined),
    heads,
    kvHeads,
    intermediate: num(raw, 'ffn_hidden_size', 4 * hidden),
    newDecoderArchitecture: newArch,
    parallelNorms: lns as 1 | 2,
    bias: raw.bias === true,
    ropeTheta: rope.theta,
    ...(rope.scaling ? { ropeScaling: rope.scaling } : {}),
    normEps: num(raw, 'layer_norm_epsilon', 1e-5),
    initializerRange: num(raw, 'initializer_range', 0.02),
    tieWordEmbeddings: raw.tie_word_embeddings !== false,
    bosTokenId: firstId(raw.bos_token_id),
    eosTokenId: firstId(raw.eos_token_id),
  });
  validateFalcon(c);
  return c;
}

export function falconToHF(c: FalconConfig): Record<string, unknown> {
  return {
    architectures: ['FalconForCausalLM'],
    model_type: 'falcon',
    vocab_size: c.vocabSize,
    max_position_embeddings: c.maxPositions,
    hidden_size: c.hidden,
    num_hidden_layers: c.layers,
    num_attention_heads: c.heads,
    num_kv_heads: c.newDecoderArchitecture ? c.kvHeads : c.heads,
    ffn_hidden_size: c.intermediate,
    new_decoder_architecture: c.newDecoderArchitecture,
    multi_query: !c.newDecoderArchitecture,
    parallel_attn: true,
    num_ln_in_parallel_attn: c.parallelNorms,
    alibi: false,
    bias: c.bias,
    activation: 'gelu',
    rope_theta: c.ropeTheta,
    rope_scaling: ropeToHF(c.ropeScaling),
    layer_norm_epsilon: c.normEps,
    initializer_range: c.initializerRange,
    tie_word_embeddings: c.tieWordEmbeddings,
    hidden_dropout: 0,
    attention_dropout: 0,
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenId,
    torch_dtype: 'float32',
  };
}

class FalconAttention extends Module {
  readonly query_key_value: Linear;
  readonly dense: Linear;
  constructor(
    private readonly c: FalconConfig,
    rng: Generator,
  ) {
    super();
    const hd = c.hidden / c.heads;
    this.query_key_value = this.addModule('query_key_value', proj(c.hidden, (c.heads + 2 * c.kvHeads) * hd, c.bias, c, rng));
    this.dense = this.addModule('dense', proj(c.hidden, c.hidden, c.bias, c, rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number, rope: { cos: Tensor; sin: Tensor }): Tensor {
    const c = this.c;
    const [b, t] = x.shape;
    const hd = c.hidden / c.heads;
    const nkv = c.kvHeads;
    const groups = c.heads / nkv;
    const qkv = this.query_key_value.forward(x);
    let q: Tensor;
    let k: Tensor;
    let v: Tensor;
    if (c.newDecoderArchitecture) {
      // per kv head: its `groups` query heads, its key, its value
      [q, k, v] = qkv.reshape([b, t, nkv, groups + 2, hd]).split([groups, 1, 1], 3); // [B, T, nkv, groups | 1 | 1, hd]
    } else {
      // every query head, then the one key and the one value
      [q, k, v] = qkv.reshape([b, t, c.heads + 2, hd]).split([c.heads, 1, 1], 2); // [B, T, nh | 1 | 1, hd]
    }
    const query = applyRotary(q.reshape([b, t, c.heads, hd]).transpose(1, 2), rope); // [B, nh, T, hd]
    const key = applyRotary(k.reshape([b, t, nkv, hd]).transpose(1, 2), rope); // [B, nkv, T, hd]
    const value = v.reshape([b, t, nkv, hd]).transpose(1, 2); // [B, nkv, T, hd]
    const y = cachedAttention(query, key, value, ctx, blockIndex, groups); // [B, nh, T, hd]
    return this.dense.forward(mergeHeads(y)); // [B, T, H]
  }
}

export class FalconDecoderLayer extends Module {
  /** Before the attention and the MLP both (one norm), or before the attention (two). */
  readonly input_layernorm: LayerNorm | null;
  readonly ln_attn: LayerNorm | null;
  readonly ln_mlp: LayerNorm | null;
  readonly self_attention: FalconAttention;
  readonly mlp: GeluMLP;
  private readonly rope: RopeSpec;
  private readonly ropeKey: string;
  constructor(
    private readonly c: FalconConfig,
    rng: Generator,
  ) {
    super();
    this.rope = { theta: c.ropeTheta, rotaryDim: c.hidden / c.heads, maxPositions: c.maxPositions, scaling: c.ropeScaling };
    this.ropeKey = JSON.stringify(this.rope);
    const two = c.parallelNorms === 2;
    this.ln_attn = two ? this.addModule('ln_attn', new LayerNorm(c.hidden, c.normEps)) : null;
    this.ln_mlp = two ? this.addModule('ln_mlp', new LayerNorm(c.hidden, c.normEps)) : null;
    this.input_layernorm = two ? null : this.addModule('input_layernorm', new LayerNorm(c.hidden, c.normEps));
    this.self_attention = this.addModule('self_attention', new FalconAttention(c, rng));
    this.mlp = this.addModule('mlp', new GeluMLP(c, c.bias, 'erf', rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    const rope = cachedRotaryTables(ctx.positions, this.rope, this.ropeKey);
    const attnIn = (this.ln_attn ?? this.input_layernorm!).forward(x);
    const mlpIn = this.ln_mlp ? this.ln_mlp.forward(x) : attnIn;
    const attn = this.self_attention.forward(attnIn, ctx, blockIndex, rope);
    return this.mlp.forward(mlpIn).add(attn).add(x);
  }
}

/** Falcon's decoder shell: the checkpoint's names around its blocks, its checks and its block. */
const FALCON_SHELL: ShellSpec<FalconConfig, FalconDecoderLayer> = {
  names: { prefix: 'transformer', table: 'word_embeddings', blocks: 'h', norm: 'ln_f', head: 'lm_head' },
  validate: validateFalcon,
  block: (c, rng) => new FalconDecoderLayer(c, rng),
  blockProfile: falconBlockProfile,
};

export class Falcon extends ShellLM<FalconConfig, FalconDecoderLayer> {
  /** @param options.section build only layers [start, end), uninitialised (see sectionSetup). */
  constructor(config: FalconConfig, options: ShellOptions = {}) {
    super(config, options, FALCON_SHELL);
  }
}

/** A Falcon block's weights: one or two layer norms, the fused q/k/v over its kv heads, dense and the MLP. */
function falconBlockWeights(c: FalconConfig): NamedShape[] {
  const h = c.hidden;
  const qkv = (c.heads + 2 * c.kvHeads) * (h / c.heads);
  return [
    ...(c.parallelNorms === 2 ? [...layerNormWeights('ln_attn', h), ...layerNormWeights('ln_mlp', h)] : layerNormWeights('input_layernorm', h)),
    ...linearWeights('self_attention.query_key_value', h, qkv, c.bias),
    ...linearWeights('self_attention.dense', h, h, c.bias),
    ...linearWeights('mlp.dense_h_to_4h', h, c.intermediate, c.bias),
    ...linearWeights('mlp.dense_4h_to_h', c.intermediate, h, c.bias),
  ];
}

/** A falcon block's profile for the planner, from its weights. */
function falconBlockProfile(c: FalconConfig): LayerProfile {
  return denseBlockProfile(falconBlockWeights(c), c.hidden, c.hidden, c.kvHeads * (c.hidden / c.heads));
}

export const falcon: Family<FalconConfig> = {
  name: 'falcon',
  architecture: 'FalconForCausalLM',
  fixtures: ['falcon'],
  layout: shellLayout(FALCON_SHELL.names),
  owns: (c) => c.arch === 'falcon',
  fromHF: falconFromHF,
  toHF: falconToHF,
  validate: validateFalcon,
  create: (c, options) => new Falcon(c, options),
  blockWeights: falconBlockWeights,
  blockProfile: falconBlockProfile,
  // the new decoder architecture, grouped by --kv-heads
  small(s) {
    noWindow(s, 'falcon');
    const intermediate = s.intermediate ?? 4 * s.hidden;
    return falconConfig({ ...smallBase(s), newDecoderArchitecture: true, kvHeads: s.kvHeads, intermediate });
  },
};
