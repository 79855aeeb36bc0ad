import { InvalidArgumentError } from '../../errors.ts';
import { denseBlockProfile, type Family, layerNormWeights, linearWeights, multiHead, type NamedShape, noWindow, shellLayout, smallBase } from './family.ts';
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
 * GPT-NeoX (Pythia, GPT-NeoX-20B) as transformers' GPTNeoXForCausalLM: LayerNorm blocks whose
 * attention and MLP read the same input and add to it together (the parallel residual), a fused
 * query_key_value laid out head by head ([q, k, v] of head 0, then head 1, …), rotary on the
 * first `rotary_pct` of each head, and an untied head named `embed_out`.
 */
export interface GPTNeoXConfig extends DecoderConfigBase {
  arch: 'gpt_neox';
  /** Share of each head's dims that rotate (rotary_pct, 0.25); the rotated dims are int(headDim × this). */
  rotaryPct: number;
  /** Rotary base (rotary_emb_base, 10000). */
  ropeTheta: number;
  /** rope_scaling (linear, dynamic, yarn, llama3, see rope.ts); absent: the plain rotary. */
  ropeScaling?: RopeScaling;
  /** x + attn(ln1(x)) + mlp(ln2(x)) (true), or the two residuals in turn (false). */
  parallelResidual: boolean;
  /** Bias on query_key_value and dense (attention_bias, true). */
  attentionBias: boolean;
  /** hidden_act: 'gelu' is the exact (erf) GELU, the others its tanh approximation. */
  hiddenAct: 'gelu' | 'gelu_new' | 'gelu_pytorch_tanh';
}

/** Pythia-160M's shape unless overridden. */
export function gptNeoXConfig(overrides: Partial<Omit<GPTNeoXConfig, 'arch'>> = {}): GPTNeoXConfig {
  const hidden = overrides.hidden ?? 768;
  return {
    arch: 'gpt_neox',
    vocabSize: 50304,
    maxPositions: 2048,
    layers: 12,
    heads: 12,
    rotaryPct: 0.25,
    ropeTheta: 10000,
    normEps: 1e-5,
    initializerRange: 0.02,
    tieWordEmbeddings: false,
    parallelResidual: true,
    attentionBias: true,
    hiddenAct: 'gelu',
    bosTokenId: 0,
    eosTokenId: 0,
    ...overrides,
    hidden,
    intermediate: overrides.intermediate ?? 4 * hidden,
  };
}

/** Rotated dims per head: int(headDim × rotary_pct), as transformers truncates it. */
export function gptNeoXRotaryDims(c: GPTNeoXConfig): number {
  return Math.trunc((c.hidden / c.heads) * c.rotaryPct);
}

/** Throws InvalidArgumentError naming what does not fit. */
export function validateGPTNeoX(c: GPTNeoXConfig): void {
  if (c.hidden % c.heads !== 0) throw new InvalidArgumentError(`GPT-NeoX hidden size ${c.hidden} is not divisible by ${c.heads} heads`);
  if (!(c.rotaryPct >= 0 && c.rotaryPct <= 1)) throw new InvalidArgumentError(`GPT-NeoX rotary_pct ${c.rotaryPct} is not within [0, 1]`);
  const dims = gptNeoXRotaryDims(c);
  if (dims % 2 !== 0) throw new InvalidArgumentError(`GPT-NeoX rotates ${dims} dims per head (rotary_pct ${c.rotaryPct}): an odd number is not supported`);
}

const NEOX_ACTS = ['gelu', 'gelu_new', 'gelu_pytorch_tanh'] as const;

/** Reads a `model_type: gpt_neox` config.json (its older keys, rotary_pct and rotary_emb_base, or transformers 5's rope_parameters). */
export function gptNeoXFromHF(raw: Record<string, unknown>): GPTNeoXConfig {
  const params = (raw.rope_parameters ?? null) as Record<string, unknown> | null;
  const rope = ropeFromHF(raw, num(raw, 'rotary_emb_base', 10000));
  const act = raw.hidden_act ?? 'gelu';
  if (!NEOX_ACTS.includes(act as GPTNeoXConfig['hiddenAct'])) {
    throw new InvalidArgumentError(`GPT-NeoX hidden_act '${String(act)}' is not supported (${NEOX_ACTS.join(', ')})`);
  }
  const pick = (key: string, ...fallbacks: string[]) => {
    if (params && typeof params[key] === 'number') return params[key];
    for (const k of fallbacks) if (typeof raw[k] === 'number') return raw[k];
    return undefined;
  };
  const hidden = num(raw, 'hidden_size');
  return gptNeoXConfig({
    vocabSize: num(raw, 'vocab_size'),
    maxPositions: num(raw, 'max_position_embeddings', 2048),
    hidden,
    layers: num(raw, 'num_hidden_layers'),
    heads: num(raw, 'num_attention_heads'),
    intermediate: num(raw, 'intermediate_size', 4 * hidden),
    rotaryPct: pick('partial_rotary_factor', 'rotary_pct', 'partial_rotary_factor') ?? 0.25,
    ropeTheta: rope.theta,
    ...(rope.scaling ? { ropeScaling: rope.scaling } : {}),
    normEps: num(raw, 'layer_norm_eps', 1e-5),
    initializerRange: num(raw, 'initializer_range', 0.02),
    tieWordEmbeddings: raw.tie_word_embeddings === true,
    parallelResidual: raw.use_parallel_residual !== false,
    attentionBias: raw.attention_bias !== false,
    hiddenAct: act as GPTNeoXConfig['hiddenAct'],
    bosTokenId: firstId(raw.bos_token_id),
    eosTokenId: firstId(raw.eos_token_id),
  });
}

/** Writes the config as transformers' config.json (the Hub's keys, which every version reads). */
export function gptNeoXToHF(c: GPTNeoXConfig): Record<string, unknown> {
  return {
    architectures: ['GPTNeoXForCausalLM'],
    model_type: 'gpt_neox',
    vocab_size: c.vocabSize,
    max_position_embeddings: c.maxPositions,
    hidden_size: c.hidden,
    num_hidden_layers: c.layers,
    num_attention_heads: c.heads,
    intermediate_size: c.intermediate,
    rotary_pct: c.rotaryPct,
    rotary_emb_base: c.ropeTheta,
    rope_scaling: ropeToHF(c.ropeScaling),
    use_parallel_residual: c.parallelResidual,
    attention_bias: c.attentionBias,
    hidden_act: c.hiddenAct,
    layer_norm_eps: c.normEps,
    initializer_range: c.initializerRange,
    tie_word_embeddings: c.tieWordEmbeddings,
    hidden_dropout: 0,
    attention_dropout: 0,
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenId,
    torch_dtype: 'float32',
  };
}

class GPTNeoXAttention extends Module {
  readonly query_key_value: Linear;
  readonly dense: Linear;
  constructor(
    private readonly c: GPTNeoXConfig,
    rng: Generator,
  ) {
    super();
    this.query_key_value = this.addModule('query_key_value', proj(c.hidden, 3 * c.hidden, c.attentionBias, c, rng));
    this.dense = this.addModule('dense', proj(c.hidden, c.hidden, c.attentionBias, c, rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number, rope: { cos: Tensor; sin: Tensor } | null): Tensor {
    const [b, t] = x.shape;
    const nh = this.c.heads;
    const hd = this.c.hidden / nh;
    // per head: [q, k, v], each hd wide
    const [q, k, v] = this.query_key_value.forward(x).reshape([b, t, nh, 3 * hd]).split(hd, -1); // 3 × [B, T, nh, hd]
    const query = rope ? applyRotary(q.transpose(1, 2), rope) : q.transpose(1, 2); // [B, nh, T, hd]
    const key = rope ? applyRotary(k.transpose(1, 2), rope) : k.transpose(1, 2); // [B, nh, T, hd]
    const y = cachedAttention(query, key, v.transpose(1, 2), ctx, blockIndex); // [B, nh, T, hd]
    return this.dense.forward(mergeHeads(y)); // [B, T, H]
  }
}

export class GPTNeoXLayer extends Module {
  readonly input_layernorm: LayerNorm;
  readonly post_attention_layernorm: LayerNorm;
  readonly attention: GPTNeoXAttention;
  readonly mlp: GeluMLP;
  /** The rotary of the first int(headDim × rotary_pct) dims (none when that is 0). */
  private readonly rope: RopeSpec | null;
  private readonly ropeKey: string;
  constructor(
    private readonly c: GPTNeoXConfig,
    rng: Generator,
  ) {
    super();
    const rotaryDim = gptNeoXRotaryDims(c);
    this.rope = rotaryDim > 0 ? { theta: c.ropeTheta, rotaryDim, maxPositions: c.maxPositions, scaling: c.ropeScaling } : null;
    this.ropeKey = JSON.stringify(this.rope);
    this.input_layernorm = this.addModule('input_layernorm', new LayerNorm(c.hidden, c.normEps));
    this.post_attention_layernorm = this.addModule('post_attention_layernorm', new LayerNorm(c.hidden, c.normEps));
    this.attention = this.addModule('attention', new GPTNeoXAttention(c, rng));
    this.mlp = this.addModule('mlp', new GeluMLP(c, true, c.hiddenAct === 'gelu' ? 'erf' : 'tanh', rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    const rope = this.rope ? cachedRotaryTables(ctx.positions, this.rope, this.ropeKey) : null;
    const attn = this.attention.forward(this.input_layernorm.forward(x), ctx, blockIndex, rope);
    if (this.c.parallelResidual) return this.mlp.forward(this.post_attention_layernorm.forward(x)).add(attn).add(x);
    const h = attn.add(x);
    return this.mlp.forward(this.post_attention_layernorm.forward(h)).add(h);
  }
}

/** GPT-NeoX's decoder shell (its untied head is transformers' lm_head at run time, `embed_out` in checkpoints). */
const GPT_NEOX_SHELL: ShellSpec<GPTNeoXConfig, GPTNeoXLayer> = {
  names: { prefix: 'gpt_neox', table: 'embed_in', blocks: 'layers', norm: 'final_layer_norm', head: 'embed_out' },
  validate: validateGPTNeoX,
  block: (c, rng) => new GPTNeoXLayer(c, rng),
  blockProfile: gptNeoXBlockProfile,
};

export class GPTNeoX extends ShellLM<GPTNeoXConfig, GPTNeoXLayer> {
  /** @param options.section build only layers [start, end), uninitialised (see sectionSetup). */
  constructor(config: GPTNeoXConfig, options: ShellOptions = {}) {
    super(config, options, GPT_NEOX_SHELL);
  }
}

/** A GPT-NeoX block's weights: two layer norms, the fused q/k/v and its dense (biased or not), the biased MLP. */
function gptNeoXBlockWeights(c: GPTNeoXConfig): NamedShape[] {
  const h = c.hidden;
  return [
    ...layerNormWeights('input_layernorm', h),
    ...layerNormWeights('post_attention_layernorm', h),
    ...linearWeights('attention.query_key_value', h, 3 * h, c.attentionBias),
    ...linearWeights('attention.dense', h, h, c.attentionBias),
    ...linearWeights('mlp.dense_h_to_4h', h, c.intermediate, true),
    ...linearWeights('mlp.dense_4h_to_h', c.intermediate, h, true),
  ];
}

/** A gptNeoX block's profile for the planner, from its weights. */
function gptNeoXBlockProfile(c: GPTNeoXConfig): LayerProfile {
  return denseBlockProfile(gptNeoXBlockWeights(c), c.hidden, c.hidden, c.hidden);
}

export const gptNeoX: Family<GPTNeoXConfig> = {
  name: 'gpt_neox',
  architecture: 'GPTNeoXForCausalLM',
  fixtures: ['gpt_neox'],
  layout: shellLayout(GPT_NEOX_SHELL.names),
  owns: (c) => c.arch === 'gpt_neox',
  fromHF: gptNeoXFromHF,
  toHF: gptNeoXToHF,
  validate: validateGPTNeoX,
  create: (c, options) => new GPTNeoX(c, options),
  blockWeights: gptNeoXBlockWeights,
  blockProfile: gptNeoXBlockProfile,
  small(s) {
    noWindow(s, 'gpt_neox');
    multiHead(s);
    return gptNeoXConfig({ ...smallBase(s), intermediate: s.intermediate ?? 4 * s.hidden });
  },
};
