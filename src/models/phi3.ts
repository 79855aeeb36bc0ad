import { type Linear, Module } from '../nn/index.ts';
import type { Generator, Tensor } from '../tensor/index.ts';
import type { LlamaConfig } from './config.ts';
import { type BlockAttention, proj } from './decoder-parts.ts';
import { cachedAttention, mergeHeads, splitHeads } from './forward.ts';
import type { ForwardContext } from './model.ts';
import { applyRotary } from './rope.ts';

/**
 * Phi-3's differences from Llama (transformers' modeling_phi3.py): one projection for q, k and v
 * (`qkv_proj`, their rows in that order) and one for the MLP's gate and up (`gate_up_proj`, the
 * gate's rows first), and a rotary on the first partial_rotary_factor of each head's dims. The
 * rest of the block is Llama's (llama.ts).
 */

export class Phi3Attention extends Module {
  readonly qkv_proj: Linear;
  readonly o_proj: Linear;
  constructor(
    private readonly c: LlamaConfig,
    rng: Generator,
  ) {
    super();
    const q = c.heads * c.headDim;
    const kv = c.kvHeads * c.headDim;
    this.qkv_proj = this.addModule('qkv_proj', proj(c.hidden, q + 2 * kv, false, c, rng));
    this.o_proj = this.addModule('o_proj', proj(q, c.hidden, false, c, rng));
  }

  forward(x: Tensor, ctx: ForwardContext, blockIndex: number, at: BlockAttention): Tensor {
    const c = this.c;
    const kv = c.kvHeads * c.headDim;
    const [q, k, v] = this.qkv_proj.forward(x).split([c.heads * c.headDim, kv, kv], -1); // [B, T, nh·hd], 2 × [B, T, nkv·hd]
    const y = cachedAttention(
      applyRotary(splitHeads(q, c.heads), at.rope), // [B, nh, T, hd]
      applyRotary(splitHeads(k, c.kvHeads), at.rope), // [B, nkv, T, hd]
      splitHeads(v, c.kvHeads),
      ctx,
      blockIndex,
      c.heads / c.kvHeads,
      at.options,
    ); // [B, nh, T, hd]
    return this.o_proj.forward(mergeHeads(y)); // [B, T, H]
  }
}

export class Phi3MLP extends Module {
  readonly gate_up_proj: Linear;
  readonly down_proj: Linear;
  constructor(
    private readonly c: LlamaConfig,
    rng: Generator,
  ) {
    super();
    this.gate_up_proj = this.addModule('gate_up_proj', proj(c.hidden, 2 * c.intermediate, false, c, rng));
    this.down_proj = this.addModule('down_proj', proj(c.intermediate, c.hidden, false, c, rng));
  }

  forward(x: Tensor): Tensor {
    const [gate, up] = this.gate_up_proj.forward(x).split(this.c.intermediate, -1); // 2 × [B, T, I]
    return this.down_proj.forward(up.mul(gate.silu()));
  }
}
