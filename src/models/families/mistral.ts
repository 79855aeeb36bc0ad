import type { LlamaConfig } from '../config.ts';
import {
  DECODER_LAYOUT, decoderConfigFromHF, decoderConfigToHF, slidingWindowOf, smallDecoder, validateDecoderConfig,
} from '../llama-config.ts';
import { decoderBlockWeights, Llama } from '../llama.ts';
import type { Family } from './family.ts';

/** Mistral's window on every block, 4096 where config.json leaves sliding_window out (as transformers' MistralConfig). */
const WINDOW = 4096;

/**
 * Mistral (transformers' MistralForCausalLM): the shared decoder with a sliding window on every block and no biases.
 * llama.cpp writes it as its `llama` architecture, and reads that back as Llama.
 */
export const mistral: Family<LlamaConfig> = {
  name: 'mistral',
  architecture: 'MistralForCausalLM',
  fixtures: ['mistral'],
  layout: DECODER_LAYOUT,
  gguf: { arch: 'llama', permuted: true, reads: false },
  owns: (c) => c.arch === 'llama' && c.modelType === 'mistral',
  fromHF(raw) {
    const c = decoderConfigFromHF(raw, 'mistral', { maxPositions: 131072, normEps: 1e-6 });
    const window = slidingWindowOf(raw, WINDOW);
    if (window !== null) c.slidingWindow = window;
    return c;
  },
  // the window defaults to 4096 when left out: none is written as null
  toHF: (c) => ({ ...decoderConfigToHF(c, 'MistralForCausalLM'), sliding_window: c.slidingWindow ?? null }),
  validate: (c) => validateDecoderConfig(c, { slidingWindow: true, ropeScaling: true }),
  create: (c, options) => new Llama(c, options),
  blockWeights: (c) => decoderBlockWeights(c),
  small: (s) => smallDecoder(s, 'mistral', { slidingWindow: s.slidingWindow ?? WINDOW }),
};
