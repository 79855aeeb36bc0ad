import { Embedding, LayerNorm, Module, ModuleList } from '../nn/index.ts';
import { Generator, linear, ZeroGenerator, randn, type Tensor, zeros } from '../tensor/index.ts';
import type { GPT2Config } from './config.ts';
import { cachedAttention, mergeHeads, runLayers, splitHeads } from './forward.ts';
import type { CausalLM, ForwardContext, ForwardOptions, LayerProfile, ModelLayer } from './model.ts';
import type { Tokenizer } from './tokenizer.ts';

/** GPT-2 as Hugging Face's GPT2LMHeadModel: same module names, same numbers. */

function normal(shape: number[], std: number, rng: Generator): Tensor {
  const t = randn(shape, { generator: rng });
  for (let i = 0; i < t.size; i++) t.data[i] *= std;
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
  readonly wte: Embedding;
  readonly wpe: Embedding;
  readonly h: ModuleList<GPT2Block>;
  readonly ln_f: LayerNorm;
  constructor(c: GPT2Config, rng: Generator) {
    super();
    this.wte = this.addModule('wte', new Embedding(c.vocabSize, c.hidden, { rng, std: c.initializerRange }));
    this.wpe = this.addModule('wpe', new Embedding(c.maxPositions, c.hidden, { rng, std: c.initializerRange }));
    this.h = this.addModule('h', new ModuleList(Array.from({ length: c.layers }, () => new GPT2Block(c, rng))));
    this.ln_f = this.addModule('ln_f', new LayerNorm(c.hidden, c.normEps));
  }
}

class LMHead extends Module {
  readonly weight: Tensor;
  constructor(c: GPT2Config, rng: Generator) {
    super();
    this.weight = this.addParameter('weight', normal([c.vocabSize, c.hidden], c.initializerRange, rng));
  }
}

export class GPT2 extends Module implements CausalLM {
  readonly transformer: GPT2Transformer;
  /** The untied head (null when the head is the token embedding, as in GPT-2). */
  readonly lm_head: LMHead | null;
  readonly layers: readonly ModelLayer[];
  tokenizer: Tokenizer | null = null;

  constructor(
    readonly config: GPT2Config,
    options: { seed?: number; init?: boolean } = {},
  ) {
    super();
    const rng = options.init === false ? new ZeroGenerator() : new Generator(options.seed ?? 0);
    this.transformer = this.addModule('transformer', new GPT2Transformer(config, rng));
    this.lm_head = config.tieWordEmbeddings ? null : this.addModule('lm_head', new LMHead(config, rng));
    this.layers = this.buildLayers();
  }

  private buildLayers(): ModelLayer[] {
    const c = this.config;
    const t = this.transformer;
    const h = c.hidden;
    const perToken = (params: number, extra = 0) => 2 * params + extra;
    const profile = (params: number, flops: number, out: number, attn = 0, kv = 0): (() => LayerProfile) => () => ({
      params,
      bytes: 4 * params,
      flopsPerToken: flops,
      attentionFlopsPerContextToken: attn,
      activationBytesPerToken: 4 * out,
      kvBytesPerToken: kv,
    });
    const blockParams = t.h.at(0).numParameters();
    const headWeight = () => this.lm_head?.weight ?? t.wte.weight;
    const headName = this.lm_head ? 'lm_head.weight' : 'transformer.wte.weight';
    const layers: ModelLayer[] = [
      {
        name: 'transformer.embeddings',
        kind: 'embedding',
        blockIndex: -1,
        namedParameters: () => [
          ['transformer.wte.weight', t.wte.weight],
          ['transformer.wpe.weight', t.wpe.weight],
        ],
        forward: (ids, ctx) => t.wte.forward(ids).add(t.wpe.forward(ctx.positions)),
        profile: profile(t.wte.weight.size + t.wpe.weight.size, h, h),
      },
      ...Array.from({ length: c.layers }, (_, i): ModelLayer => ({
        name: `transformer.h.${i}`,
        kind: 'block',
        blockIndex: i,
        namedParameters: () => [...t.h.at(i).namedParameters(`transformer.h.${i}`)],
        forward: (x, ctx) => t.h.at(i).forward(x, ctx, i),
        profile: profile(blockParams, perToken(blockParams), h, 4 * h, 2 * 4 * h),
      })),
      {
        name: 'transformer.ln_f',
        kind: 'norm',
        blockIndex: -1,
        namedParameters: () => [...t.ln_f.namedParameters('transformer.ln_f')],
        forward: (x) => t.ln_f.forward(x),
        profile: profile(2 * h, 8 * h, h),
      },
      {
        name: 'lm_head',
        kind: 'head',
        blockIndex: -1,
        namedParameters: () => [[headName, headWeight()]],
        forward: (x) => linear(x, headWeight()),
        profile: profile(c.vocabSize * h, 2 * c.vocabSize * h, c.vocabSize),
      },
    ];
    return layers;
  }

  forward(ids: Tensor, options: ForwardOptions = {}): Tensor {
    return runLayers(this.layers, ids, options, this.config.maxPositions);
  }

  hfStateDict(): Map<string, Tensor> {
    return new Map(this.namedParameters());
  }
}
