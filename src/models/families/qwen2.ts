import { type DecoderConfig, isDecoderConfig } from '../config.ts';
import {
  DECODER_LAYOUT, decoderConfigFromHF, decoderConfigToHF, layerTypesFromHF, layerTypesToHF, smallDecoder, validateDecoderConfig,
} from '../decoder-config.ts';
import { decoderBlockWeights, Decoder, decoderBlockProfile } from '../decoder.ts';
import type { Family } from './family.ts';

/**
 * Qwen2 (transformers' Qwen2ForCausalLM): the shared decoder with biases on q, k and v (always), and a window on the
 * blocks from max_window_layers on (or those layer_types names) when use_sliding_window.
 */
export const qwen2: Family<DecoderConfig> = {
  name: 'qwen2',
  architecture: 'Qwen2ForCausalLM',
  fixtures: ['qwen2'],
  layout: DECODER_LAYOUT,
  gguf: { arch: 'qwen2', permuted: false, reads: true, qkvBiasBuiltIn: true },
  owns: (c) => isDecoderConfig(c) && c.modelType === 'qwen2',
  fromHF(raw) {
    const c = decoderConfigFromHF(raw, 'qwen2', { maxPositions: 32768, normEps: 1e-6 });
    c.qkvBias = true;
    return Object.assign(c, layerTypesFromHF(raw, c.layers));
  },
  toHF: (c) => ({ ...decoderConfigToHF(c, qwen2.architecture), ...layerTypesToHF(c) }),
  validate: (c) => validateDecoderConfig(c, { slidingWindow: true, layerTypes: true, ropeScaling: true, attentionBias: true }),
  create: (c, options) => new Decoder(c, options),
  blockWeights: (c) => decoderBlockWeights(c),
  blockProfile: (c) => decoderBlockProfile(c, decoderBlockWeights(c)),
  small: (s) => smallDecoder(s, 'qwen2', { qkvBias: true, ...(s.slidingWindow === undefined ? {} : { slidingWindow: s.slidingWindow }) }),
};
