import { Embedding, Linear, Module, ModuleList, RMSNorm } from '../nn/index.ts';
import { gatedMlp, Generator, type LinearParams, linears, type Tensor } from '../tensor/index.ts';
import type { DecoderConfig } from './config.ts';
import { cachedAttention, mergeHeads, splitHeads } from './forward.ts';
import { type BlockAttention, headsOf, normalInit, proj } from './decoder-parts.ts';
import { denseBlockProfile, type NamedShape } from './families/family.ts';
import { canDecodeStep, type DecodeBlock, type DecodeShape, decodeStep, decodeStepFits } from './generation/decode-step.ts';
import { blockWindow, rotaryDim } from './decoder-config.ts';
import { type ForwardContext, type LayerProfile,
  type ModelLayer, type ModelPart, type SectionParts } from './model.ts';
import { applyRotary, cachedRotaryTables, type RopeSpec, rotaryTablesFor } from './rope.ts';
import { DecoderLM, decoderLayers, plainEmbedding, sectionSetup } from './decoder-layers.ts';

/**
 * The shared decoder, as transformers computes it (RMSNorm, rotary grouped-query attention, RMSNorm,
 * SwiGLU, residuals around each), and the parts a family may swap in (BlockParts): q/k norms, its own attention or
 * MLP. The families that differ from it in a part or two (families/*.ts) build it with theirs. The rotary and its
 * scalings are in rope.ts, the attention's window in attention.ts.
 */

/**
 * cos and sin of the rotary angles for int32 positions [B, T]: [B, T, headDim] each,
 * computed as Hugging Face does in float32 (inverse frequencies θ^(−2i/d), halves repeated).
 */
export function rotaryTables(positions: Tensor, headDim: number, theta: number): { cos: Tensor; sin: Tensor } {
  return rotaryTablesFor(positions, { theta, rotaryDim: headDim, maxPositions: Number.POSITIVE_INFINITY });
}

/** The rotary of a shared-decoder config: its base, its rotated dims, its scaling. */
export function decoderRope(c: DecoderConfig): RopeSpec {
  const spec: RopeSpec = { theta: c.ropeTheta, rotaryDim: rotaryDim(c), maxPositions: c.maxPositions };
  if (c.ropeScaling) spec.scaling = c.ropeScaling;
  return spec;
}

/** A Linear whose forward is Linear's (not replaced on the instance), which the fused products may stand for. */
function plainLinear(l: Linear): boolean {
  return Object.getPrototypeOf(l) === Linear.prototype && !Object.hasOwn(l, 'forward');
}

/**
 * A Linear's tensors as the fused ops take them: a plain object, so that a traced step records the weights as values
 * of the step (constants a graph is fed), not as attributes of a module it cannot see into.
 */
const params = (l: Linear): LinearParams => ({ weight: l.weight, bias: l.bias });

/** Each layer's output for the same input: in one native call on ort (the layers' own forwards otherwise). */
function projections(x: Tensor, layers: Linear[]): Tensor[] {
  return layers.every(plainLinear) ? linears(x, layers.map(params)) : layers.map((l) => l.forward(x));
}

/** What the shared attention reads of a config (the MoE families build it from theirs); qkNorm: per-head q/k RMSNorms. */
export type DecoderAttentionConfig = Pick<DecoderConfig, 'hidden' | 'heads' | 'kvHeads' | 'headDim' | 'qkvBias' | 'oBias' | 'normEps' | 'initializerRange'>
  & { qkNorm?: boolean };

/** A block's attention as a family may give it: (x, context, block index, rotary and options) → [B, T, H]. */
export type AttentionModule = Module & { forward(x: Tensor, ctx: ForwardContext, blockIndex: number, at: BlockAttention): Tensor };
/** A block's MLP as a family may give it: [B, T, H] → [B, T, H]. */
export type MlpModule = Module & { forward(x: Tensor): Tensor };

/**
 * What a family puts into the shared block besides its config: per-head q/k norms, or its own attention and MLP, and
 * then the checkpoint names and shapes of its block (what its parameters count).
 */
export interface BlockParts {
  qkNorm?: boolean;
  attention?: (c: DecoderConfig, rng: Generator) => AttentionModule;
  mlp?: (c: DecoderConfig, rng: Generator) => MlpModule;
  weights?: (c: DecoderConfig) => NamedShape[];
}

/** A shared-decoder block's profile from its weights (grouped-query attention: the keys and values of kvHeads heads). */
export function decoderBlockProfile(c: DecoderConfig, weights: readonly NamedShape[]): LayerProfile {
  return denseBlockProfile(weights, c.hidden, c.heads * c.headDim, c.kvHeads * c.headDim);
}

/**
 * The checkpoint names and shapes of a shared-decoder block (after `model.layers.N.`): norms, q/k/v/o with the biases
 * the config has, q/k norms when asked, and the gated MLP.
 */
export function decoderBlockWeights(c: DecoderAttentionConfig & Pick<DecoderConfig, 'intermediate' | 'mlpBias'>): NamedShape[] {
  const h = c.hidden;
  const q = c.heads * c.headDim;
  const kv = c.kvHeads * c.headDim;
  const i = c.intermediate;
  const bias = (name: string, size: number, has: boolean | undefined): NamedShape[] => (has ? [[name, [size]]] : []);
  return [
    ['input_layernorm.weight', [h]],
    ...attentionWeights(c),
    ['post_attention_layernorm.weight', [h]],
    ['mlp.gate_proj.weight', [i, h]], ...bias('mlp.gate_proj.bias', i, c.mlpBias),
    ['mlp.up_proj.weight', [i, h]], ...bias('mlp.up_proj.bias', i, c.mlpBias),
    ['mlp.down_proj.weight', [h, i]], ...bias('mlp.down_proj.bias', h, c.mlpBias),
  ];
  function attentionWeights(a: DecoderAttentionConfig): NamedShape[] {
    return [
      ['self_attn.q_proj.weight', [q, h]], ...bias('self_attn.q_proj.bias', q, a.qkvBias),
      ['self_attn.k_proj.weight', [kv, h]], ...bias('self_attn.k_proj.bias', kv, a.qkvBias),
      ['self_attn.v_proj.weight', [kv, h]], ...bias('self_attn.v_proj.bias', kv, a.qkvBias),
      ['self_attn.o_proj.weight', [h, q]], ...bias('self_attn.o_proj.bias', h, a.oBias),
      ...(a.qkNorm ? [['self_attn.q_norm.weight', [a.headDim]], ['self_attn.k_norm.weight', [a.headDim]]] as NamedShape[] : []),
    ];
  }
}

/** A norm over the last dim. */
export type NormModule = Module & { forward(x: Tensor): Tensor };
/** How a family makes its norms: RMSNorm by default (a family may scale by 1 + w instead). */
export type NormFactory = (size: number, eps: number) => NormModule;
const rmsNormOf: NormFactory = (size, eps) => new RMSNorm(size, eps);

export class DecoderAttention extends Module {
  readonly q_proj: Linear;
  readonly k_proj: Linear;
  readonly v_proj: Linear;
  readonly o_proj: Linear;
  /** Per-head norms on queries and keys, before the rotary (qkNorm). */
  readonly q_norm: NormModule | null = null;
  readonly k_norm: NormModule | null = null;
  /** @param norm makes the q/k norms (RMSNorm unless the family has its own). */
  constructor(
    private readonly c: DecoderAttentionConfig,
    rng: Generator,
    norm: NormFactory = rmsNormOf,
  ) {
    super();
    this.q_proj = this.addModule('q_proj', proj(c.hidden, c.heads * c.headDim, c.qkvBias, c, rng));
    this.k_proj = this.addModule('k_proj', proj(c.hidden, c.kvHeads * c.headDim, c.qkvBias, c, rng));
    this.v_proj = this.addModule('v_proj', proj(c.hidden, c.kvHeads * c.headDim, c.qkvBias, c, rng));
    this.o_proj = this.addModule('o_proj', proj(c.heads * c.headDim, c.hidden, c.oBias, c, rng));
    if (c.qkNorm) {
      this.q_norm = this.addModule('q_norm', norm(c.headDim, c.normEps));
      this.k_norm = this.addModule('k_norm', norm(c.headDim, c.normEps));
    }
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number, at: BlockAttention): Tensor {
    const c = this.c;
    const [qx, kx, vx] = projections(x, [this.q_proj, this.k_proj, this.v_proj]); // [B, T, nh·hd], [B, T, nkv·hd] ×2
    const q = applyRotary(headsOf(qx, c.heads, this.q_norm), at.rope); // [B, nh, T, hd]
    const k = applyRotary(headsOf(kx, c.kvHeads, this.k_norm), at.rope); // [B, nkv, T, hd]
    const v = splitHeads(vx, c.kvHeads); // [B, nkv, T, hd]
    const y = cachedAttention(q, k, v, ctx, blockIndex, c.heads / c.kvHeads, at.options); // [B, nh, T, hd]
    return this.o_proj.forward(mergeHeads(y)); // [B, T, H]
  }
}

/** The gated MLP's activation: SiLU (SwiGLU), or GELU's tanh approximation (GeGLU). */
export type GateActivation = 'silu' | 'gelu';

/** down(act(gate(x)) ⊙ up(x)), biased where the config says (mlp_bias). */
export class DecoderMLP extends Module {
  readonly gate_proj: Linear;
  readonly up_proj: Linear;
  readonly down_proj: Linear;
  constructor(
    c: Pick<DecoderConfig, 'hidden' | 'intermediate' | 'mlpBias' | 'initializerRange'>,
    rng: Generator,
    private readonly act: GateActivation = 'silu',
  ) {
    super();
    const bias = c.mlpBias === true;
    this.gate_proj = this.addModule('gate_proj', proj(c.hidden, c.intermediate, bias, c, rng));
    this.up_proj = this.addModule('up_proj', proj(c.hidden, c.intermediate, bias, c, rng));
    this.down_proj = this.addModule('down_proj', proj(c.intermediate, c.hidden, bias, c, rng));
  }

  forward(x: Tensor): Tensor {
    const { gate_proj: gate, up_proj: up, down_proj: down } = this;
    if (this.act === 'gelu') return down.forward(gate.forward(x).gelu().mul(up.forward(x)));
    // one native call on ort
    if (plainLinear(gate) && plainLinear(up) && plainLinear(down)) return gatedMlp(x, params(gate), params(up), params(down));
    return down.forward(gate.forward(x).silu().mul(up.forward(x)));
  }
}

/** One row's decoding step of a shared-decoder block, as DecoderBlock.decodePlan gives it. */
export interface DecodePlan {
  block: DecodeBlock;
  shape: DecodeShape;
  rope: { cos: Tensor; sin: Tensor };
}

export class DecoderBlock extends Module {
  readonly input_layernorm: RMSNorm;
  readonly self_attn: DecoderAttention | AttentionModule;
  readonly post_attention_layernorm: RMSNorm;
  readonly mlp: DecoderMLP | MlpModule;
  private readonly rope: RopeSpec;
  private readonly ropeKey: string;
  constructor(
    private readonly c: DecoderConfig,
    rng: Generator,
    parts: BlockParts = {},
  ) {
    super();
    this.input_layernorm = this.addModule('input_layernorm', new RMSNorm(c.hidden, c.normEps));
    const attention = parts.attention ? parts.attention(c, rng) : new DecoderAttention({ ...c, qkNorm: parts.qkNorm === true }, rng);
    this.self_attn = this.addModule('self_attn', attention);
    this.post_attention_layernorm = this.addModule('post_attention_layernorm', new RMSNorm(c.hidden, c.normEps));
    this.mlp = this.addModule('mlp', parts.mlp ? parts.mlp(c, rng) : new DecoderMLP(c, rng));
    this.rope = decoderRope(c);
    this.ropeKey = JSON.stringify(this.rope);
  }

  /**
   * What a batched decoding step (generation/decode-batch.ts) needs to run this block for one row x [1, 1, hidden] with its own
   * context: the block, its shape and the row's rotary tables; null where this block's forward must run instead.
   */
  decodePlan(x: Tensor, ctx: ForwardContext, blockIndex: number): DecodePlan | null {
    if (!(this.self_attn instanceof DecoderAttention) || !(this.mlp instanceof DecoderMLP)) return null;
    if (Object.getPrototypeOf(this) !== DecoderBlock.prototype || Object.hasOwn(this, 'forward')) return null;
    const rope = cachedRotaryTables(ctx.positions, this.rope, this.ropeKey);
    const shape = { heads: this.c.heads, kvHeads: this.c.kvHeads, headDim: this.c.headDim, window: blockWindow(this.c, blockIndex) };
    const block = this as DecodeBlock;
    return decodeStepFits(block, x, ctx, blockIndex, shape, rope) ? { block, shape, rope } : null;
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    const rope = cachedRotaryTables(ctx.positions, this.rope, this.ropeKey);
    const window = blockWindow(this.c, blockIndex);
    if (this.self_attn instanceof DecoderAttention && this.mlp instanceof DecoderMLP) {
      // one token with the cache on a backend with fused products: the same arithmetic on plain buffers (generation/decode-step.ts)
      const shape = { heads: this.c.heads, kvHeads: this.c.kvHeads, headDim: this.c.headDim, window };
      const block = this as DecodeBlock;
      if (canDecodeStep(block, x, ctx, blockIndex, shape, rope)) return decodeStep(block, x, ctx, blockIndex, shape, rope);
    }
    const at: BlockAttention = { rope, options: window === undefined ? {} : { window } };
    x = x.add(this.self_attn.forward(this.input_layernorm.forward(x), ctx, blockIndex, at));
    return x.add(this.mlp.forward(this.post_attention_layernorm.forward(x)));
  }
}

class DecoderModel extends Module {
  readonly embed_tokens: Embedding | null;
  readonly layers: ModuleList<DecoderBlock>;
  readonly norm: RMSNorm | null;
  constructor(c: DecoderConfig, rng: Generator, parts: SectionParts, blockParts: BlockParts) {
    super();
    this.embed_tokens = parts.tokenTable ? this.addModule('embed_tokens', new Embedding(c.vocabSize, c.hidden, { rng })) : null;
    if (this.embed_tokens) normalInit(this.embed_tokens, c.initializerRange, rng);
    const [first, last] = parts.blocks;
    const blocks = Array.from({ length: last - first }, () => new DecoderBlock(c, rng, blockParts));
    this.layers = this.addModule('layers', new ModuleList(blocks, first));
    this.norm = parts.norm ? this.addModule('norm', new RMSNorm(c.hidden, c.normEps)) : null;
  }
}

export class Decoder extends DecoderLM {
  readonly model: DecoderModel;
  readonly lm_head: Linear | null;

  /**
   * @param options.section build only layers [start, end), uninitialised (see sectionSetup).
   * @param blockParts what the family puts into each block besides its config.
   */
  constructor(
    readonly config: DecoderConfig,
    options: { seed?: number; init?: boolean; section?: ModelPart } = {},
    private readonly blockParts: BlockParts = {},
  ) {
    super();
    const { parts, section, rng } = sectionSetup(config.layers, config.tieWordEmbeddings, options);
    this.section = section;
    this.model = this.addModule('model', new DecoderModel(config, rng, parts, blockParts));
    this.lm_head
      = !config.tieWordEmbeddings && parts.head ? this.addModule('lm_head', proj(config.hidden, config.vocabSize, false, config, rng)) : null;
    this.setLayers(this.buildLayers());
  }

  private buildLayers(): ModelLayer[] {
    const c = this.config;
    const m = this.model;
    const h = c.hidden;
    // a block's profile, counted from its checkpoint names (a section may hold no block to count)
    const p = this.blockParts;
    const profile = decoderBlockProfile(c, p.weights ? p.weights(c) : decoderBlockWeights({ ...c, qkNorm: p.qkNorm === true }));
    const headWeight = () => this.lm_head?.weight ?? m.embed_tokens!.weight;
    const headName = c.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
    return decoderLayers({
      blocks: c.layers, hidden: h, vocab: c.vocabSize,
      embedding: plainEmbedding('model.embed_tokens', () => m.embed_tokens!, c.vocabSize, h),
      blockPrefix: 'model.layers',
      block: (i) => m.layers.byIndex(i),
      blockProfile: () => ({ ...profile }),
      norm: { name: 'model.norm', module: () => m.norm!, params: h },
      head: { name: 'lm_head', weightName: headName, weight: headWeight },
    });
  }
}
