import { existsSync, readdirSync } from 'node:fs';
import {
  bloomConfig,
  byteLevelTokenizerJson,
  createModel,
  falconConfig,
  gemmaConfig,
  gpt2Config,
  gptNeoXConfig,
  HFTokenizer,
  llamaConfig,
  mixtralConfig,
  type ModelConfig,
  qwen3MoeConfig,
  saveModel,
} from '../../models/index.ts';
import { type Flags, intFlag, optionalIntFlag, requiredString, stringFlag, UsageError } from '../args.ts';
import type { Output } from '../output.ts';

export const initModelOptions = {
  'arch': { type: 'string' },
  'layers': { type: 'string' },
  'hidden': { type: 'string' },
  'heads': { type: 'string' },
  'kv-heads': { type: 'string' },
  'sliding-window': { type: 'string' },
  'intermediate': { type: 'string' },
  'vocab': { type: 'string' },
  'max-positions': { type: 'string' },
  'seed': { type: 'string' },
  'out': { type: 'string' },
  'force': { type: 'boolean' },
} as const;

/** The Llama-like families (Hugging Face model_type values), small Llama shapes each with its family's parts. */
const LLAMA_ARCHS = ['llama', 'mistral', 'qwen2', 'qwen3', 'phi3'];

/** Byte-level tokenizer: 256 byte tokens + <|endoftext|>. */
const BYTE_VOCAB = 257;

interface SmallShape {
  vocabSize: number;
  hidden: number;
  heads: number;
  layers: number;
  maxPositions: number;
  bosTokenId: number;
  eosTokenId: number;
}

/**
 * GPT-NeoX, Falcon (its new decoder architecture, grouped by --kv-heads), BLOOM and Gemma 2 and 3
 * (their default window, and hidden / heads per head), at the small shape of the flags.
 */
const OTHER_ARCHS: Record<string, (c: SmallShape, kvHeads: number, intermediate: number | undefined) => ModelConfig> = {
  gpt_neox: (c, kvHeads, intermediate) => gptNeoXConfig({ ...c, intermediate: intermediate ?? 4 * c.hidden, ...multiHead(c, kvHeads) }),
  falcon: (c, kvHeads, intermediate) =>
    falconConfig({ ...c, newDecoderArchitecture: true, kvHeads, intermediate: intermediate ?? 4 * c.hidden }),
  bloom: (c, kvHeads, intermediate) => {
    if (intermediate !== undefined && intermediate !== 4 * c.hidden) throw new UsageError(`BLOOM's MLP is 4 × --hidden wide, not --intermediate ${intermediate}`);
    return bloomConfig({ ...c, padTokenId: undefined, ...multiHead(c, kvHeads) });
  },
  gemma2: (c, kvHeads, intermediate) => gemmaConfig({ ...c, modelType: 'gemma2', kvHeads, headDim: c.hidden / c.heads, intermediate: intermediate ?? 4 * c.hidden }),
  gemma3_text: (c, kvHeads, intermediate) =>
    gemmaConfig({ ...c, modelType: 'gemma3_text', kvHeads, headDim: c.hidden / c.heads, intermediate: intermediate ?? 4 * c.hidden }),
  // the MoE families: 4 (Mixtral) or 8 (Qwen3-MoE) experts of --intermediate width, 2 run per token
  mixtral: (c, kvHeads, intermediate) => mixtralConfig({ ...c, kvHeads, intermediate: intermediate ?? 2 * c.hidden }),
  qwen3_moe: (c, kvHeads, intermediate) =>
    qwen3MoeConfig({ ...c, kvHeads, moeIntermediate: intermediate ?? c.hidden, intermediate: 4 * c.hidden }),
};

/** GPT-NeoX and BLOOM have as many key/value heads as heads. */
function multiHead(c: SmallShape, kvHeads: number): object {
  if (kvHeads !== c.heads) throw new UsageError(`--kv-heads is not part of this --arch (its ${c.heads} heads each have their keys and values)`);
  return {};
}

/** `tensorlink init-model`: a new randomly initialised model in Hugging Face layout, with a byte-level tokenizer. */
export async function initModel(flags: Flags, out: Output): Promise<void> {
  const arch = stringFlag(flags, 'arch') ?? 'gpt2';
  const other = Object.hasOwn(OTHER_ARCHS, arch) ? OTHER_ARCHS[arch] : undefined;
  if (arch !== 'gpt2' && !LLAMA_ARCHS.includes(arch) && !other) {
    throw new UsageError(`--arch must be gpt2, ${[...LLAMA_ARCHS, ...Object.keys(OTHER_ARCHS)].join(', ')}, got '${arch}'`);
  }
  const dir = requiredString(flags, 'out');
  if (existsSync(dir) && readdirSync(dir).length > 0 && flags.force !== true) {
    throw new UsageError(`${dir} is not empty (pass --force to overwrite)`);
  }
  const vocab = intFlag(flags, 'vocab', BYTE_VOCAB);
  if (vocab < BYTE_VOCAB) throw new UsageError(`--vocab must be at least ${BYTE_VOCAB} for the byte-level tokenizer`);
  const hidden = intFlag(flags, 'hidden', 128);
  const heads = intFlag(flags, 'heads', 4);
  if (hidden % heads !== 0) throw new UsageError(`--hidden ${hidden} is not divisible by --heads ${heads}`);
  const common = {
    vocabSize: vocab,
    hidden,
    heads,
    layers: intFlag(flags, 'layers', 4),
    maxPositions: intFlag(flags, 'max-positions', 256),
    bosTokenId: 256,
    eosTokenId: 256,
  };
  const intermediate = optionalIntFlag(flags, 'intermediate', 1);
  // Mistral slides a window of 4096 unless told otherwise, as transformers; the others only when told
  const slidingWindow = optionalIntFlag(flags, 'sliding-window', 1) ?? (arch === 'mistral' ? 4096 : undefined);
  if (slidingWindow !== undefined && (arch === 'gpt2' || arch === 'llama' || other)) throw new UsageError(`--sliding-window is not part of --arch ${arch}`);
  if (other) return writeModel(other(common, intFlag(flags, 'kv-heads', heads), intermediate), arch, dir, flags, out);
  const config
    = arch === 'gpt2'
      ? gpt2Config({ ...common, intermediate: intermediate ?? 4 * hidden })
      : llamaConfig({
          ...common,
          kvHeads: intFlag(flags, 'kv-heads', heads),
          intermediate: intermediate ?? Math.round((8 * hidden) / 3),
          tieWordEmbeddings: true,
          modelType: arch,
          ...(arch === 'qwen2' ? { qkvBias: true } : {}),
          ...(slidingWindow === undefined ? {} : { slidingWindow }),
        });
  if (config.arch === 'llama' && heads % config.kvHeads !== 0) throw new UsageError(`--heads ${heads} is not a multiple of --kv-heads`);
  return writeModel(config, arch, dir, flags, out);
}

/** Writes a new model of `config`, with the byte-level tokenizer, to `dir`. */
async function writeModel(config: ModelConfig, arch: string, dir: string, flags: Flags, out: Output): Promise<void> {
  const seed = intFlag(flags, 'seed', 0, 0);
  const model = createModel(config, { seed });
  model.tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  const files = await saveModel(model, dir);
  const result = { out: dir, arch, parameters: model.numParameters(), seed, files, config };
  out.result(result, `wrote a ${arch} model with ${model.numParameters()} parameters (seed ${seed}) to ${dir}: ${files.join(', ')}`);
}
