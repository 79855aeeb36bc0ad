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

/** Root-mean-square normalisation (Llama) with a learned scale. */
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
