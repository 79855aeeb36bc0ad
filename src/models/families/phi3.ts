import { InvalidArgumentError } from '../../errors.ts';
import { type Linear, Module } from '../../nn/index.ts';
import type { Generator, Tensor } from '../../tensor/index.ts';
import { type DecoderConfig, isDecoderConfig } from '../config.ts';
import { type BlockAttention, proj } from '../decoder-parts.ts';
import { cachedAttention, mergeHeads, splitHeads } from '../forward.ts';
import type { ForwardContext } from '../model.ts';
import { DECODER_LAYOUT, decoderConfigFromHF, decoderConfigToHF, slidingWindowOf, smallDecoder, validateDecoderConfig } from '../decoder-config.ts';
import { type BlockParts, Decoder, decoderBlockProfile } from '../decoder.ts';
import { applyRotary } from '../rope.ts';
import type { Family, NamedShape } from './family.ts';

/**
 * Phi-3's differences from the shared decoder (transformers' modeling_phi3.py): one projection for q, k and v
 * (`qkv_proj`, their rows in that order) and one for the MLP's gate and up (`gate_up_proj`, the gate's rows first), a
 * rotary on the first partial_rotary_factor of each head's dims, an optional window, no biases. The rest of the block
 * is the shared decoder's (../decoder.ts).
 */

export class Phi3Attention extends Module {
  readonly qkv_proj: Linear;
  readonly o_proj: Linear;
  constructor(
    private readonly c: DecoderConfig,
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
    private readonly c: DecoderConfig,
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

/** Phi-3's block weights: the shared decoder's norms around its fused projections. */
function phi3BlockWeights(c: DecoderConfig): NamedShape[] {
  const h = c.hidden;
  const q = c.heads * c.headDim;
  const kv = c.kvHeads * c.headDim;
  return [
    ['input_layernorm.weight', [h]],
    ['self_attn.qkv_proj.weight', [q + 2 * kv, h]],
    ['self_attn.o_proj.weight', [h, q]],
    ['post_attention_layernorm.weight', [h]],
    ['mlp.gate_up_proj.weight', [2 * c.intermediate, h]],
    ['mlp.down_proj.weight', [h, c.intermediate]],
  ];
}

const PHI3_PARTS: BlockParts = {
  attention: (c, rng) => new Phi3Attention(c, rng),
  mlp: (c, rng) => new Phi3MLP(c, rng),
  weights: phi3BlockWeights,
};

export const phi3: Family<DecoderConfig> = {
  name: 'phi3',
  architecture: 'Phi3ForCausalLM',
  fixtures: ['phi3'],
  layout: DECODER_LAYOUT,
  owns: (c) => isDecoderConfig(c) && c.modelType === 'phi3',
  fromHF(raw) {
    const c = decoderConfigFromHF(raw, 'phi3', { maxPositions: 4096, normEps: 1e-5, partialRotary: true });
    if (c.ropeScaling) throw new InvalidArgumentError(`phi3 rope_scaling type '${c.ropeScaling.type}' is not supported (default only)`);
    const partial = raw.partial_rotary_factor;
    if (partial !== undefined && partial !== null && partial !== 1) {
      if (typeof partial !== 'number') throw new InvalidArgumentError(`config.json partial_rotary_factor must be a number`);
      c.partialRotaryFactor = partial;
    }
    const window = slidingWindowOf(raw, null);
    if (window !== null) c.slidingWindow = window;
    return c;
  },
  toHF(c) {
    const out = decoderConfigToHF(c, phi3.architecture);
    if (c.slidingWindow !== undefined) out.sliding_window = c.slidingWindow;
    return out;
  },
  validate: (c) => validateDecoderConfig(c, { slidingWindow: true, partialRotary: true }),
  create: (c, options) => new Decoder(c, options, PHI3_PARTS),
  blockWeights: phi3BlockWeights,
  blockProfile: (c) => decoderBlockProfile(c, phi3BlockWeights(c)),
  small: (s) => smallDecoder(s, 'phi3', s.slidingWindow === undefined ? {} : { slidingWindow: s.slidingWindow }),
};
