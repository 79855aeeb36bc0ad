import { Embedding, Linear, Module, ModuleList, RMSNorm } from '../nn/index.ts';
import { Generator, linear, ZeroGenerator, randn, rotaryEmbedding, type Tensor, tensor } from '../tensor/index.ts';
import type { LlamaConfig } from './config.ts';
import { cachedAttention, mergeHeads, runLayers, splitHeads } from './forward.ts';
import { type CausalLM, type ForwardContext, type ForwardOptions, layerProfile,
  type ModelLayer, type ModelPart, partLayers, type SectionParts, sectionParts } from './model.ts';
import type { Tokenizer } from './tokenizer.ts';

/** Llama as Hugging Face's LlamaForCausalLM (and Mistral/Qwen2, which reduce to it). */

function normalInit(module: Linear | Embedding, std: number, rng: Generator): void {
  const w = randn(module.weight.shape, { generator: rng });
  for (let i = 0; i < w.size; i++) module.weight.data[i] = w.data[i] * std;
  if (module instanceof Linear && module.bias) module.bias.data.fill(0);
}

function proj(inF: number, outF: number, bias: boolean, c: LlamaConfig, rng: Generator): Linear {
  const l = new Linear(inF, outF, { rng, bias });
  normalInit(l, c.initializerRange, rng);
  return l;
}

/**
 * cos and sin of the rotary angles for int32 positions [B, T]: [B, T, headDim] each,
 * computed as Hugging Face does in float32 (inverse frequencies θ^(−2i/d), halves repeated).
 */
const tableCache = new WeakMap<Tensor, Map<string, { cos: Tensor; sin: Tensor }>>();

/** rotaryTables, computed once per positions tensor (every block of a forward shares them; positions tensors are not mutated). */
function cachedRotaryTables(positions: Tensor, headDim: number, theta: number): { cos: Tensor; sin: Tensor } {
  let byShape = tableCache.get(positions);
  if (!byShape) {
    byShape = new Map();
    tableCache.set(positions, byShape);
  }
  const key = `${headDim}:${theta}`;
  let tables = byShape.get(key);
  if (!tables) {
    tables = rotaryTables(positions, headDim, theta);
    byShape.set(key, tables);
  }
  return tables;
}

export function rotaryTables(positions: Tensor, headDim: number, theta: number): { cos: Tensor; sin: Tensor } {
  const [b, t] = positions.shape;
  const half = headDim / 2;
  const invFreq = new Float32Array(half);
  for (let i = 0; i < half; i++) invFreq[i] = 1 / Math.fround(theta ** Math.fround((2 * i) / headDim));
  const cos = new Float32Array(b * t * headDim);
  const sin = new Float32Array(b * t * headDim);
  for (let r = 0; r < b * t; r++) {
    const p = positions.data[r];
    for (let i = 0; i < half; i++) {
      const angle = Math.fround(p * invFreq[i]);
      const c = Math.cos(angle);
      const s = Math.sin(angle);
      cos[r * headDim + i] = c;
      cos[r * headDim + i + half] = c;
      sin[r * headDim + i] = s;
      sin[r * headDim + i + half] = s;
    }
  }
  return { cos: tensor(cos, [b, t, headDim]), sin: tensor(sin, [b, t, headDim]) };
}

class LlamaAttention extends Module {
  readonly q_proj: Linear;
  readonly k_proj: Linear;
  readonly v_proj: Linear;
  readonly o_proj: Linear;
  constructor(
    private readonly c: LlamaConfig,
    rng: Generator,
  ) {
    super();
    this.q_proj = this.addModule('q_proj', proj(c.hidden, c.heads * c.headDim, c.qkvBias, c, rng));
    this.k_proj = this.addModule('k_proj', proj(c.hidden, c.kvHeads * c.headDim, c.qkvBias, c, rng));
    this.v_proj = this.addModule('v_proj', proj(c.hidden, c.kvHeads * c.headDim, c.qkvBias, c, rng));
    this.o_proj = this.addModule('o_proj', proj(c.heads * c.headDim, c.hidden, c.oBias, c, rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number, rope: { cos: Tensor; sin: Tensor }): Tensor {
    const c = this.c;
    const q = rotaryEmbedding(splitHeads(this.q_proj.forward(x), c.heads), rope.cos, rope.sin); // [B, nh, T, hd]
    const k = rotaryEmbedding(splitHeads(this.k_proj.forward(x), c.kvHeads), rope.cos, rope.sin); // [B, nkv, T, hd]
    const v = splitHeads(this.v_proj.forward(x), c.kvHeads); // [B, nkv, T, hd]
    const y = cachedAttention(q, k, v, ctx, blockIndex, c.heads / c.kvHeads); // [B, nh, T, hd]
    return this.o_proj.forward(mergeHeads(y)); // [B, T, H]
  }
}

class LlamaMLP extends Module {
  readonly gate_proj: Linear;
  readonly up_proj: Linear;
  readonly down_proj: Linear;
  constructor(c: LlamaConfig, rng: Generator) {
    super();
    this.gate_proj = this.addModule('gate_proj', proj(c.hidden, c.intermediate, false, c, rng));
    this.up_proj = this.addModule('up_proj', proj(c.hidden, c.intermediate, false, c, rng));
    this.down_proj = this.addModule('down_proj', proj(c.intermediate, c.hidden, false, c, rng));
  }

  forward(x: Tensor): Tensor {
    return this.down_proj.forward(this.gate_proj.forward(x).silu().mul(this.up_proj.forward(x)));
  }
}

export class LlamaDecoderLayer extends Module {
  readonly input_layernorm: RMSNorm;
  readonly self_attn: LlamaAttention;
  readonly post_attention_layernorm: RMSNorm;
  readonly mlp: LlamaMLP;
  constructor(
    private readonly c: LlamaConfig,
    rng: Generator,
  ) {
    super();
    this.input_layernorm = this.addModule('input_layernorm', new RMSNorm(c.hidden, c.normEps));
    this.self_attn = this.addModule('self_attn', new LlamaAttention(c, rng));
    this.post_attention_layernorm = this.addModule('post_attention_layernorm', new RMSNorm(c.hidden, c.normEps));
    this.mlp = this.addModule('mlp', new LlamaMLP(c, rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    const rope = cachedRotaryTables(ctx.positions, this.c.headDim, this.c.ropeTheta);
    x = x.add(this.self_attn.forward(this.input_layernorm.forward(x), ctx, blockIndex, rope));
    return x.add(this.mlp.forward(this.post_attention_layernorm.forward(x)));
  }
}

class LlamaModel extends Module {
  readonly embed_tokens: Embedding | null;
  readonly layers: ModuleList<LlamaDecoderLayer>;
  readonly norm: RMSNorm | null;
  constructor(c: LlamaConfig, rng: Generator, parts: SectionParts) {
    super();
    this.embed_tokens = parts.tokenTable ? this.addModule('embed_tokens', new Embedding(c.vocabSize, c.hidden, { rng })) : null;
    if (this.embed_tokens) normalInit(this.embed_tokens, c.initializerRange, rng);
    const [first, last] = parts.blocks;
    this.layers = this.addModule('layers', new ModuleList(Array.from({ length: last - first }, () => new LlamaDecoderLayer(c, rng)), first));
    this.norm = parts.norm ? this.addModule('norm', new RMSNorm(c.hidden, c.normEps)) : null;
  }
}

export class Llama extends Module implements CausalLM {
  readonly model: LlamaModel;
  readonly lm_head: Linear | null;
  readonly layers: readonly ModelLayer[];
  readonly wholeLayers: readonly ModelLayer[];
  readonly section: ModelPart;
  tokenizer: Tokenizer | null = null;

  /** @param options.section build only layers [start, end), uninitialised (see GPT2). */
  constructor(
    readonly config: LlamaConfig,
    options: { seed?: number; init?: boolean; section?: ModelPart } = {},
  ) {
    super();
    const parts = sectionParts(config.layers, options.section, config.tieWordEmbeddings);
    this.section = options.section ?? [0, config.layers + 3];
    const rng = options.init === false || options.section ? new ZeroGenerator() : new Generator(options.seed ?? 0);
    this.model = this.addModule('model', new LlamaModel(config, rng, parts));
    this.lm_head
      = !config.tieWordEmbeddings && parts.head ? this.addModule('lm_head', proj(config.hidden, config.vocabSize, false, config, rng)) : null;
    this.wholeLayers = this.buildLayers();
    this.layers = partLayers(this.wholeLayers, this.section);
  }

  private buildLayers(): ModelLayer[] {
    const c = this.config;
    const m = this.model;
    const h = c.hidden;
    // the sizes of a block, from the config (a section may hold none to count)
    const q = c.heads * c.headDim;
    const kv = c.kvHeads * c.headDim;
    const blockParams
      = 2 * h + h * q + 2 * h * kv + q * h + (c.qkvBias ? q + 2 * kv : 0) + (c.oBias ? h : 0) + 3 * h * c.intermediate;
    const headWeight = () => this.lm_head?.weight ?? m.embed_tokens!.weight;
    const headName = c.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
    return [
      {
        name: 'model.embed_tokens',
        kind: 'embedding',
        blockIndex: -1,
        namedParameters: () => [['model.embed_tokens.weight', m.embed_tokens!.weight]],
        forward: (ids) => m.embed_tokens!.forward(ids),
        profile: () => layerProfile(c.vocabSize * h, 0, h),
      },
      ...Array.from({ length: c.layers }, (_, i): ModelLayer => ({
        name: `model.layers.${i}`,
        kind: 'block',
        blockIndex: i,
        namedParameters: () => [...m.layers.byIndex(i).namedParameters(`model.layers.${i}`)],
        forward: (x, ctx) => m.layers.byIndex(i).forward(x, ctx, i),
        profile: () => layerProfile(blockParams, 2 * blockParams, h, 4 * c.heads * c.headDim, 2 * c.kvHeads * c.headDim),
      })),
      {
        name: 'model.norm',
        kind: 'norm',
        blockIndex: -1,
        namedParameters: () => [['model.norm.weight', m.norm!.weight]],
        forward: (x) => m.norm!.forward(x),
        profile: () => layerProfile(h, 4 * h, h),
      },
      {
        name: 'lm_head',
        kind: 'head',
        blockIndex: -1,
        namedParameters: () => [[headName, headWeight()]],
        forward: (x) => linear(x, headWeight()),
        profile: () => layerProfile(c.vocabSize * h, 2 * c.vocabSize * h, c.vocabSize),
      },
    ];
  }

  forward(ids: Tensor, options: ForwardOptions = {}): Tensor {
    return runLayers(this.layers, ids, options, this.config.maxPositions);
  }

  hfStateDict(): Map<string, Tensor> {
    return new Map(this.namedParameters());
  }
}
