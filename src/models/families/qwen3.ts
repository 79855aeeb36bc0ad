import { type DecoderConfig, isDecoderConfig } from '../config.ts';
import {
  DECODER_LAYOUT, decoderConfigFromHF, decoderConfigToHF, layerTypesFromHF, layerTypesToHF, smallDecoder, validateDecoderConfig,
} from '../decoder-config.ts';
import { decoderBlockWeights, Decoder, decoderBlockProfile } from '../decoder.ts';
import type { Family } from './family.ts';

/**
 * Qwen3 (transformers' Qwen3ForCausalLM): the shared decoder with per-head RMSNorms on queries and keys before the
 * rotary, heads 128 wide unless head_dim says otherwise, optional attention biases, and Qwen's per-block windows.
 */
export const qwen3: Family<DecoderConfig> = {
  name: 'qwen3',
  architecture: 'Qwen3ForCausalLM',
  fixtures: ['qwen3'],
  layout: DECODER_LAYOUT,
  gguf: { arch: 'qwen3', permuted: false, reads: true },
  owns: (c) => isDecoderConfig(c) && c.modelType === 'qwen3',
  fromHF(raw) {
    const c = decoderConfigFromHF(raw, 'qwen3', { maxPositions: 32768, normEps: 1e-6, headDim: 128 });
    c.qkvBias = c.oBias = raw.attention_bias === true;
    return Object.assign(c, layerTypesFromHF(raw, c.layers));
  },
  toHF: (c) => ({ ...decoderConfigToHF(c, qwen3.architecture), ...layerTypesToHF(c) }),
  validate: (c) => validateDecoderConfig(c, { slidingWindow: true, layerTypes: true, ropeScaling: true, attentionBias: true }),
  create: (c, options) => new Decoder(c, options, { qkNorm: true }),
  blockWeights: (c) => decoderBlockWeights({ ...c, qkNorm: true }),
  blockProfile: (c) => decoderBlockProfile(c, decoderBlockWeights({ ...c, qkNorm: true })),
  small: (s) => smallDecoder(s, 'qwen3', s.slidingWindow === undefined ? {} : { slidingWindow: s.slidingWindow }),
};
