import { Embedding, LayerNorm, Module, ModuleList } from '../../nn/index.ts';
import { drawsNothing, Generator, linear, randn, type Tensor, zeros } from '../../tensor/index.ts';
import { InvalidArgumentError } from '../../errors.ts';
import type { DecoderConfigBase } from '../config.ts';
import { firstId, num } from '../config-fields.ts';
import { denseBlockProfile, type Family, type Json, type NamedShape, noWindow, smallBase } from './family.ts';
import { cachedAttention, mergeHeads, splitHeads } from '../forward.ts';
import { type ForwardContext, type LayerProfile, layerProfile,
  type ModelLayer, type ModelPart, type SectionParts } from '../model.ts';
import { DecoderLM, decoderLayers, sectionSetup } from '../decoder-layers.ts';

/** GPT-2 as Hugging Face's GPT2LMHeadModel: same module names, same numbers. */

/** GPT-2 (Hugging Face `model_type: gpt2`). Defaults are GPT-2 small's: vocabulary 50257, 1024 positions, 768 wide, 12 blocks and heads. */
export interface GPT2Config extends DecoderConfigBase {
  arch: 'gpt2';
}

export function gpt2Config(overrides: Partial<Omit<GPT2Config, 'arch'>> = {}): GPT2Config {
  const hidden = overrides.hidden ?? 768;
  return {
    arch: 'gpt2',
    vocabSize: 50257,
    maxPositions: 1024,
    layers: 12,
    heads: 12,
    normEps: 1e-5,
    initializerRange: 0.02,
    tieWordEmbeddings: true,
    bosTokenId: 50256,
    eosTokenId: 50256,
    ...overrides,
    hidden,
    intermediate: overrides.intermediate ?? 4 * hidden,
  };
}

function normal(shape: number[], std: number, rng: Generator): Tensor {
  const t = randn(shape, { generator: rng });
  if (!drawsNothing(rng)) for (let i = 0; i < t.size; i++) t.data[i] *= std;
  return t;
}

/** A linear layer whose weight is stored [in, out] (GPT-2's Conv1D). */
export class Conv1D extends Module {
  readonly weight: Tensor;
  readonly bias: Tensor;
  constructor(inF: number, outF: number, std: number, rng: Generator) {
    super();
    this.weight = this.addParameter('weight', normal([inF, outF], std, rng));
    this.bias = this.addParameter('bias', zeros([outF]));
  }

  forward(x: Tensor): Tensor {
    return linear(x, this.weight, this.bias, true);
  }
}

class GPT2Attention extends Module {
  readonly c_attn: Conv1D;
  readonly c_proj: Conv1D;
  constructor(
    private readonly c: GPT2Config,
    rng: Generator,
  ) {
    super();
    const projStd = c.initializerRange / Math.sqrt(2 * c.layers);
    this.c_attn = this.addModule('c_attn', new Conv1D(c.hidden, 3 * c.hidden, c.initializerRange, rng));
    this.c_proj = this.addModule('c_proj', new Conv1D(c.hidden, c.hidden, projStd, rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    const [q, k, v] = this.c_attn.forward(x).split(this.c.hidden, -1); // 3 × [B, T, H]
    const h = this.c.heads;
    const y = cachedAttention(splitHeads(q, h), splitHeads(k, h), splitHeads(v, h), ctx, blockIndex); // [B, nh, T, hd]
    return this.c_proj.forward(mergeHeads(y)); // [B, T, H]
  }
}

class GPT2MLP extends Module {
  readonly c_fc: Conv1D;
  readonly c_proj: Conv1D;
  constructor(c: GPT2Config, rng: Generator) {
    super();
    this.c_fc = this.addModule('c_fc', new Conv1D(c.hidden, c.intermediate, c.initializerRange, rng));
    this.c_proj = this.addModule('c_proj', new Conv1D(c.intermediate, c.hidden, c.initializerRange / Math.sqrt(2 * c.layers), rng));
  }

  forward(x: Tensor): Tensor {
    return this.c_proj.forward(this.c_fc.forward(x).gelu());
  }
}

export class GPT2Block extends Module {
  readonly ln_1: LayerNorm;
  readonly attn: GPT2Attention;
  readonly ln_2: LayerNorm;
  readonly mlp: GPT2MLP;
  constructor(c: GPT2Config, rng: Generator) {
    super();
    this.ln_1 = this.addModule('ln_1', new LayerNorm(c.hidden, c.normEps));
    this.attn = this.addModule('attn', new GPT2Attention(c, rng));
    this.ln_2 = this.addModule('ln_2', new LayerNorm(c.hidden, c.normEps));
    this.mlp = this.addModule('mlp', new GPT2MLP(c, rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor {
    x = x.add(this.attn.forward(this.ln_1.forward(x), ctx, blockIndex));
    return x.add(this.mlp.forward(this.ln_2.forward(x)));
  }
}

class GPT2Transformer extends Module {
  readonly wte: Embedding | null;
  readonly wpe: Embedding | null;
  readonly h: ModuleList<GPT2Block>;
  readonly ln_f: LayerNorm | null;
  constructor(c: GPT2Config, rng: Generator, parts: SectionParts) {
    super();
    const std = c.initializerRange;
    this.wte = parts.tokenTable ? this.addModule('wte', new Embedding(c.vocabSize, c.hidden, { rng, std })) : null;
    this.wpe = parts.embedding ? this.addModule('wpe', new Embedding(c.maxPositions, c.hidden, { rng, std })) : null;
    const [first, last] = parts.blocks;
    const blocks = Array.from({ length: last - first }, () => new GPT2Block(c, rng));
    this.h = this.addModule('h', new ModuleList(blocks, first));
    this.ln_f = parts.norm ? this.addModule('ln_f', new LayerNorm(c.hidden, c.normEps)) : null;
  }
}

class LMHead extends Module {
  readonly weight: Tensor;
  constructor(c: GPT2Config, rng: Generator) {
    super();
    this.weight = this.addParameter('weight', normal([c.vocabSize, c.hidden], c.initializerRange, rng));
  }
}

export class GPT2 extends DecoderLM {
  readonly transformer: GPT2Transformer;
  /** The untied head (null when the head is the token embedding, as in GPT-2, or not in this section). */
  readonly lm_head: LMHead | null;

  /**
   * @param options.section build only layers [start, end) (0 = embedding, 1..L blocks,
   * L + 1 final norm, L + 2 head), without initialising them: a worker's part, loaded after.
   */
  constructor(
    readonly config: GPT2Config,
    options: { seed?: number; init?: boolean; section?: ModelPart } = {},
  ) {
    super();
    const { parts, section, rng } = sectionSetup(config.layers, config.tieWordEmbeddings, options);
    this.section = section;
    this.transformer = this.addModule('transformer', new GPT2Transformer(config, rng, parts));
    this.lm_head = !config.tieWordEmbeddings && parts.head ? this.addModule('lm_head', new LMHead(config, rng)) : null;
    this.setLayers(this.buildLayers());
  }

  private buildLayers(): ModelLayer[] {
    const c = this.config;
    const t = this.transformer;
    const h = c.hidden;
    // a block's profile, counted from its checkpoint names (a section may hold no block to count)
    const profile = gpt2BlockProfile(c);
    const headWeight = () => this.lm_head?.weight ?? t.wte!.weight;
    const headName = c.tieWordEmbeddings ? 'transformer.wte.weight' : 'lm_head.weight';
    return decoderLayers({
      blocks: c.layers, hidden: h, vocab: c.vocabSize,
      embedding: {
        name: 'transformer.embeddings',
        namedParameters: () => [
          ['transformer.wte.weight', t.wte!.weight],
          ['transformer.wpe.weight', t.wpe!.weight],
        ],
        forward: (ids, ctx) => t.wte!.forward(ids).add(t.wpe!.forward(ctx.positions)),
        profile: () => layerProfile((c.vocabSize + c.maxPositions) * h, h, h),
      },
      blockPrefix: 'transformer.h',
      block: (i) => t.h.byIndex(i),
      blockProfile: () => ({ ...profile }),
      norm: { name: 'transformer.ln_f', module: () => t.ln_f!, params: 2 * h },
      head: { name: 'lm_head', weightName: headName, weight: headWeight },
    });
  }
}

function gpt2FromHF(raw: Json): GPT2Config {
  const hidden = num(raw, 'n_embd');
  const act = raw.activation_function;
  if (act !== undefined && act !== 'gelu_new' && act !== 'gelu_pytorch_tanh') {
    throw new InvalidArgumentError(`GPT-2 activation '${String(act)}' is not supported (gelu_new only)`);
  }
  return gpt2Config({
    vocabSize: num(raw, 'vocab_size'),
    maxPositions: num(raw, 'n_positions', 1024),
    hidden,
    layers: num(raw, 'n_layer'),
    heads: num(raw, 'n_head'),
    intermediate: num(raw, 'n_inner', 4 * hidden),
    normEps: num(raw, 'layer_norm_epsilon', 1e-5),
    initializerRange: num(raw, 'initializer_range', 0.02),
    tieWordEmbeddings: raw.tie_word_embeddings !== false,
    bosTokenId: firstId(raw.bos_token_id),
    eosTokenId: firstId(raw.eos_token_id),
  });
}

function gpt2ToHF(c: GPT2Config): Json {
  return {
    architectures: ['GPT2LMHeadModel'],
    model_type: 'gpt2',
    vocab_size: c.vocabSize,
    n_positions: c.maxPositions,
    n_ctx: c.maxPositions,
    n_embd: c.hidden,
    n_layer: c.layers,
    n_head: c.heads,
    n_inner: c.intermediate,
    activation_function: 'gelu_new',
    layer_norm_epsilon: c.normEps,
    initializer_range: c.initializerRange,
    resid_pdrop: 0,
    embd_pdrop: 0,
    attn_pdrop: 0,
    tie_word_embeddings: c.tieWordEmbeddings,
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenId,
    torch_dtype: 'float32',
  };
}

/** A GPT-2 block's weights: two layer norms, the fused q/k/v and the MLP, each Conv1D stored [in, out] with a bias. */
function gpt2BlockWeights(c: GPT2Config): NamedShape[] {
  const h = c.hidden;
  const inner = c.intermediate;
  return [
    ['ln_1.weight', [h]], ['ln_1.bias', [h]],
    ['attn.c_attn.weight', [h, 3 * h]], ['attn.c_attn.bias', [3 * h]],
    ['attn.c_proj.weight', [h, h]], ['attn.c_proj.bias', [h]],
    ['ln_2.weight', [h]], ['ln_2.bias', [h]],
    ['mlp.c_fc.weight', [h, inner]], ['mlp.c_fc.bias', [inner]],
    ['mlp.c_proj.weight', [inner, h]], ['mlp.c_proj.bias', [h]],
  ];
}

/** A gpt2 block's profile for the planner, from its weights. */
function gpt2BlockProfile(c: GPT2Config): LayerProfile {
  return denseBlockProfile(gpt2BlockWeights(c), c.hidden, c.hidden, c.hidden);
}

export const gpt2: Family<GPT2Config> = {
  name: 'gpt2',
  architecture: 'GPT2LMHeadModel',
  fixtures: ['gpt2'],
  layout: { table: 'transformer.wte.weight', embedding: /^transformer\.wpe\.weight$/, blocks: 'transformer.h', norm: /^transformer\.ln_f\.(weight|bias)$/, head: 'lm_head.weight', basePrefix: 'transformer.' },
  owns: (c) => c.arch === 'gpt2',
  fromHF: gpt2FromHF,
  toHF: gpt2ToHF,
  validate(c) {
    if (c.hidden % c.heads !== 0) throw new InvalidArgumentError(`hidden size ${c.hidden} is not divisible by ${c.heads} heads`);
  },
  create: (c, options) => new GPT2(c, options),
  blockWeights: gpt2BlockWeights,
  blockProfile: gpt2BlockProfile,
  small(s) {
    noWindow(s, 'gpt2');
    return gpt2Config({ ...smallBase(s), intermediate: s.intermediate ?? 4 * s.hidden });
  },
};
