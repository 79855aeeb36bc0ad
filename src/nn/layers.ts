import {
  drawsNothing,
  dropout,
  embedding,
  type Generator,
  layerNorm,
  linear,
  ones,
  rand,
  randn,
  rmsNorm,
  type Tensor,
  zeros,
} from '../tensor/index.ts';
import { InvalidArgumentError } from '../errors.ts';
import { Module } from './module.ts';

/** Where initial weights come from: a seeded generator, so every machine builds the same model. */
export interface InitOptions {
  rng: Generator;
}

/** y = x Wᵀ + b, weight [out, in]; initialised as PyTorch (uniform ±1/√in). */
export class Linear extends Module {
  readonly weight: Tensor;
  readonly bias: Tensor | null;

  constructor(
    readonly inFeatures: number,
    readonly outFeatures: number,
    options: InitOptions & { bias?: boolean },
  ) {
    super();
    const bound = 1 / Math.sqrt(inFeatures);
    const init = { generator: options.rng, low: -bound, high: bound };
    this.weight = this.addParameter('weight', rand([outFeatures, inFeatures], init));
    this.bias = (options.bias ?? true) ? this.addParameter('bias', rand([outFeatures], init)) : null;
  }

  forward(x: Tensor): Tensor {
    return linear(x, this.weight, this.bias);
  }

  /** The LoRA factors on this layer (adapt), or null. */
  lora: Lora | null = null;

  /**
   * Puts LoRA factors on this layer, as PEFT's LoraLayer: y = x Wᵀ + b + scale · (x Aᵀ) Bᵀ, with A [r, in] and B
   * [out, r] registered as the sub-modules `lora_A` and `lora_B` (PEFT's names). The forward is replaced on the
   * instance, so fused products that stand for a plain Linear (one native call for q/k/v, the decode step) leave it
   * to its own forward. The layer's weight and bias are not frozen here (the caller freezes the base).
   */
  adapt(lora: Lora): void {
    if (this.lora) throw new InvalidArgumentError('this layer already has LoRA factors');
    if (lora.A.inFeatures !== this.inFeatures || lora.B.outFeatures !== this.outFeatures || lora.A.outFeatures !== lora.B.inFeatures) {
      throw new InvalidArgumentError(`LoRA factors [${lora.A.outFeatures}, ${lora.A.inFeatures}] and [${lora.B.outFeatures}, ${lora.B.inFeatures}] do not fit a layer [${this.outFeatures}, ${this.inFeatures}]`);
    }
    this.addModule('lora_A', lora.A);
    this.addModule('lora_B', lora.B);
    this.lora = lora;
    this.forward = (x: Tensor) => linear(x, this.weight, this.bias).add(lora.B.forward(lora.A.forward(x)).mul(lora.scale));
  }

  /** Takes the LoRA factors off (after merging them into the weight): the layer is a plain Linear again. */
  unadapt(): void {
    if (!this.lora) return;
    this.removeModule('lora_A');
    this.removeModule('lora_B');
    this.lora = null;
    delete (this as { forward?: unknown }).forward;
  }
}

/** What PEFT puts before a module's path in its file's keys, and so before a LoRA factor's name here. */
export const LORA_PARAM_PREFIX = 'base_model.model.';

/** LoRA factors of one layer: A [r, in] (down), B [out, r] (up), and the scale alpha / r (alpha / √r with rsLoRA). */
export interface Lora {
  A: Linear;
  B: Linear;
  scale: number;
}

/**
 * New LoRA factors of rank r for a layer [out, in], initialised as PEFT does by default: A uniform ±1/√in (Kaiming's
 * with a = √5, which is Linear's own), B zero, so the adapted layer starts as the layer itself.
 */
export function newLora(inFeatures: number, outFeatures: number, r: number, scale: number, rng: Generator): Lora {
  const A = new Linear(inFeatures, r, { rng, bias: false });
  const B = new Linear(r, outFeatures, { rng, bias: false });
  B.weight.data.fill(0);
  // named as PEFT's files key them: base_model.model.<module>.lora_A.weight
  A.paramPrefix = LORA_PARAM_PREFIX;
  B.paramPrefix = LORA_PARAM_PREFIX;
  return { A, B, scale };
}

/** A table of vectors looked up by int32 ids; initialised N(0, 1) as PyTorch. */
export class Embedding extends Module {
  readonly weight: Tensor;

  constructor(
    readonly numEmbeddings: number,
    readonly embeddingDim: number,
    options: InitOptions & { std?: number },
  ) {
    super();
    const w = randn([numEmbeddings, embeddingDim], { generator: options.rng });
    if (options.std !== undefined && !drawsNothing(options.rng)) for (let i = 0; i < w.size; i++) w.data[i] *= options.std;
    this.weight = this.addParameter('weight', w);
  }

  forward(ids: Tensor): Tensor {
    return embedding(ids, this.weight);
  }
}

/** Layer normalisation over the last dim with a learned scale and shift. */
export class LayerNorm extends Module {
  readonly weight: Tensor;
  readonly bias: Tensor;

  constructor(
    readonly size: number,
    readonly eps = 1e-5,
  ) {
    super();
    this.weight = this.addParameter('weight', ones([size]));
    this.bias = this.addParameter('bias', zeros([size]));
  }

  forward(x: Tensor): Tensor {
    return layerNorm(x, this.weight, this.bias, this.eps);
  }
}

/** Root-mean-square normalisation with a learned scale. */
export class RMSNorm extends Module {
  readonly weight: Tensor;

  constructor(
    readonly size: number,
    readonly eps = 1e-6,
  ) {
    super();
    this.weight = this.addParameter('weight', ones([size]));
  }

  forward(x: Tensor): Tensor {
    return rmsNorm(x, this.weight, this.eps);
  }
}

/** Inverted dropout, active only in training mode; its masks come from its own seeded generator. */
export class Dropout extends Module {
  constructor(
    readonly p: number,
    private readonly rng: Generator,
  ) {
    super();
  }

  forward(x: Tensor): Tensor {
    return dropout(x, this.p, this.rng, this.training);
  }
}
