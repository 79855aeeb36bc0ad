import { existsSync, readdirSync } from 'node:fs';
import { InvalidArgumentError } from '../../errors.ts';
import {
  byteLevelTokenizerJson,
  createModel,
  familyNamed,
  familyNames,
  HFTokenizer,
  type ModelConfig,
  saveModel,
} from '../../models/index.ts';
import { type Flags, intFlag, optionalIntFlag, requiredString, stringFlag, UsageError } from '../args.ts';
import type { Output } from '../output.ts';

/** Byte-level tokenizer: 256 byte tokens + <|endoftext|>. */
const BYTE_VOCAB = 257;

/** `tensorlink init-model`: a new randomly initialised model in Hugging Face layout, with a byte-level tokenizer. */
export async function initModel(flags: Flags, out: Output): Promise<void> {
  const arch = stringFlag(flags, 'arch') ?? 'gpt2';
  const family = familyNamed(arch);
  if (!family) throw new UsageError(`--arch must be ${familyNames().join(', ')}, got '${arch}'`);
  const dir = requiredString(flags, 'out');
  if (existsSync(dir) && readdirSync(dir).length > 0 && flags.force !== true) {
    throw new UsageError(`${dir} is not empty (pass --force to overwrite)`);
  }
  const vocab = intFlag(flags, 'vocab', BYTE_VOCAB);
  if (vocab < BYTE_VOCAB) throw new UsageError(`--vocab must be at least ${BYTE_VOCAB} for the byte-level tokenizer`);
  const hidden = intFlag(flags, 'hidden', 128);
  const heads = intFlag(flags, 'heads', 4);
  if (hidden % heads !== 0) throw new UsageError(`--hidden ${hidden} is not divisible by --heads ${heads}`);
  const shape = {
    vocabSize: vocab,
    hidden,
    heads,
    layers: intFlag(flags, 'layers', 4),
    maxPositions: intFlag(flags, 'max-positions', 256),
    bosTokenId: 256,
    eosTokenId: 256,
    kvHeads: intFlag(flags, 'kv-heads', heads),
    intermediate: optionalIntFlag(flags, 'intermediate', 1),
    slidingWindow: optionalIntFlag(flags, 'sliding-window', 1),
  };
  let config: ModelConfig;
  try {
    config = family.small(shape); // the family's small shape and defaults (its record in src/models/families/)
  } catch (err) {
    if (err instanceof InvalidArgumentError) throw new UsageError(err.message);
    throw err;
  }
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
