import { type Embedding, Linear, Module } from '../nn/index.ts';
import { drawsNothing, geluErf, type Generator, randn, type Tensor } from '../tensor/index.ts';
import type { AttentionOptions } from './attention.ts';
import { splitHeads } from './forward.ts';

/** Parts the decoder families share: initialised projections, heads (with per-head norms), what a block's attention is given. */

export function normalInit(module: Linear | Embedding, std: number, rng: Generator): void {
  if (drawsNothing(rng)) return; // built to be loaded: its zeros stay untouched
  const w = randn(module.weight.shape, { generator: rng });
  for (let i = 0; i < w.size; i++) module.weight.data[i] = w.data[i] * std;
  if (module instanceof Linear && module.bias) module.bias.data.fill(0);
}

export function proj(inF: number, outF: number, bias: boolean, c: { initializerRange: number }, rng: Generator): Linear {
  const l = new Linear(inF, outF, { rng, bias });
  normalInit(l, c.initializerRange, rng);
  return l;
}

/** [B, T, H·D] → [B, nh, T, D], each head normalised over its D dims first when a norm is given (q_norm, k_norm). */
export function headsOf(x: Tensor, heads: number, norm: { forward(x: Tensor): Tensor } | null): Tensor {
  if (!norm) return splitHeads(x, heads);
  const [b, t, hd] = x.shape;
  return norm.forward(x.reshape([b, t, heads, hd / heads])).transpose(1, 2);
}

/** What a block's attention needs besides its input: the rotary tables and the options of its attention. */
export interface BlockAttention {
  rope: { cos: Tensor; sin: Tensor };
  options: AttentionOptions;
}

/** GELU as an MLP computes it: exact (erf), or the tanh approximation. */
export type Gelu = 'erf' | 'tanh';

/**
 * The MLP of the fused-q/k/v families: dense_h_to_4h, a GELU, dense_4h_to_h (their checkpoint names), biased or not.
 */
export class GeluMLP extends Module {
  readonly dense_h_to_4h: Linear;
  readonly dense_4h_to_h: Linear;
  constructor(
    c: { hidden: number; intermediate: number; initializerRange: number },
    bias: boolean,
    private readonly gelu: Gelu,
    rng: Generator,
  ) {
    super();
    this.dense_h_to_4h = this.addModule('dense_h_to_4h', proj(c.hidden, c.intermediate, bias, c, rng));
    this.dense_4h_to_h = this.addModule('dense_4h_to_h', proj(c.intermediate, c.hidden, bias, c, rng));
  }

  forward(x: Tensor): Tensor {
    const h = this.dense_h_to_4h.forward(x);
    return this.dense_4h_to_h.forward(this.gelu === 'erf' ? geluErf(h) : h.gelu());
  }
}
