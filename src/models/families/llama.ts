import { InvalidArgumentError } from '../../errors.ts';
import { type DecoderConfig, isDecoderConfig } from '../config.ts';
import { DECODER_LAYOUT, decoderConfigFromHF, decoderConfigToHF, smallDecoder, validateDecoderConfig } from '../decoder-config.ts';
import { decoderBlockWeights, Decoder, decoderBlockProfile } from '../decoder.ts';
import type { Family } from './family.ts';

/**
 * Llama (transformers' LlamaForCausalLM) is the shared decoder itself: what it adds are its optional biases
 * (attention_bias on q, k, v and o; mlp_bias on the MLP) and Llama 3's rope scalings (rope.ts). No window.
 */
export const llama: Family<DecoderConfig> = {
  name: 'llama',
  architecture: 'LlamaForCausalLM',
  fixtures: ['llama', 'llama3', 'llama3-bf16-sharded'],
  layout: DECODER_LAYOUT,
  // llama.cpp's converter permutes q/k rows for this architecture (see checkpoints/gguf-names.ts)
  gguf: { arch: 'llama', permuted: true, reads: true },
  owns: (c) => isDecoderConfig(c) && c.modelType === 'llama',
  fromHF(raw) {
    const c = decoderConfigFromHF(raw, 'llama', { maxPositions: 2048, normEps: 1e-6 });
    c.qkvBias = c.oBias = raw.attention_bias === true;
    if (raw.mlp_bias === true) c.mlpBias = true;
    return c;
  },
  toHF: (c) => decoderConfigToHF(c, llama.architecture),
  validate: (c) => validateDecoderConfig(c, { ropeScaling: true, attentionBias: true, mlpBias: true }),
  create: (c, options) => new Decoder(c, options),
  blockWeights: (c) => decoderBlockWeights(c),
  blockProfile: (c) => decoderBlockProfile(c, decoderBlockWeights(c)),
  small(s) {
    if (s.slidingWindow !== undefined) throw new InvalidArgumentError('--sliding-window is not part of --arch llama');
    return smallDecoder(s, 'llama');
  },
};

/** The public API's Llama names for the shared decoder: its model, its config, and the config with Llama-2-7B's shape. */
export { Decoder as Llama } from '../decoder.ts';
export { type DecoderConfig as LlamaConfig, decoderConfig as llamaConfig } from '../config.ts';
