import { type DecoderConfig, isDecoderConfig } from '../config.ts';
import {
  DECODER_LAYOUT, decoderConfigFromHF, decoderConfigToHF, slidingWindowOf, smallDecoder, validateDecoderConfig,
} from '../decoder-config.ts';
import { decoderBlockWeights, Decoder, decoderBlockProfile } from '../decoder.ts';
import type { Family } from './family.ts';

/** Mistral's window on every block, 4096 where config.json leaves sliding_window out (as transformers' MistralConfig). */
const WINDOW = 4096;

/**
 * Mistral (transformers' MistralForCausalLM): the shared decoder with a sliding window on every block and no biases.
 * llama.cpp writes it as its `llama` architecture, and reads that back as Llama.
 */
export const mistral: Family<DecoderConfig> = {
  name: 'mistral',
  architecture: 'MistralForCausalLM',
  fixtures: ['mistral'],
  layout: DECODER_LAYOUT,
  // llama.cpp's converter writes it as its `llama` architecture, which is read back as the first family
  gguf: { arch: 'llama', permuted: true, reads: false },
  owns: (c) => isDecoderConfig(c) && c.modelType === 'mistral',
  fromHF(raw) {
    const c = decoderConfigFromHF(raw, 'mistral', { maxPositions: 131072, normEps: 1e-6 });
    const window = slidingWindowOf(raw, WINDOW);
    if (window !== null) c.slidingWindow = window;
    return c;
  },
  // the window defaults to 4096 when left out: none is written as null
  toHF: (c) => ({ ...decoderConfigToHF(c, mistral.architecture), sliding_window: c.slidingWindow ?? null }),
  validate: (c) => validateDecoderConfig(c, { slidingWindow: true, ropeScaling: true }),
  create: (c, options) => new Decoder(c, options),
  blockWeights: (c) => decoderBlockWeights(c),
  blockProfile: (c) => decoderBlockProfile(c, decoderBlockWeights(c)),
  small: (s) => smallDecoder(s, 'mistral', { slidingWindow: s.slidingWindow ?? WINDOW }),
};
