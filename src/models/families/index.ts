import { InvalidArgumentError } from '../../errors.ts';
import { checkConfigKeys } from '../config-fields.ts';
import { type DecoderConfig, validateSizes } from '../config.ts';
import type { CausalLM } from '../model.ts';
import { bloom, type BloomConfig } from './bloom.ts';
import { CONFIG_KEYS } from './config-keys.ts';
import { falcon, type FalconConfig } from './falcon.ts';
import type { BuildOptions, Family, GGUFArch, Json } from './family.ts';
import { gemma2, gemma3Text, type GemmaConfig } from './gemma.ts';
import { gptNeoX, type GPTNeoXConfig } from './gpt-neox.ts';
import { gpt2, type GPT2Config } from './gpt2.ts';
import { llama } from './llama.ts';
import { mistral } from './mistral.ts';
import { mixtral, type MixtralConfig } from './mixtral.ts';
import { phi3 } from './phi3.ts';
import { qwen2 } from './qwen2.ts';
import { qwen3 } from './qwen3.ts';
import { qwen3Moe, type Qwen3MoeConfig } from './qwen3-moe.ts';

/** The config of any family: each record's config type (the shared decoder's for the families built on it). */
export type ModelConfig
  = GPT2Config | DecoderConfig | GPTNeoXConfig | FalconConfig | BloomConfig | GemmaConfig | MixtralConfig | Qwen3MoeConfig;

/**
 * The registry: every model family, one line each (each record is in its own file, see family.ts). Config dispatch,
 * loading, GGUF, `tensorlink init-model --arch`, the planner's profiles and the CLI's help read this list, in its order.
 */
export const FAMILIES: readonly Family[] = [
  gpt2,
  llama,
  mistral,
  qwen2,
  qwen3,
  phi3,
  gemma2,
  gemma3Text,
  mixtral,
  qwen3Moe,
  gptNeoX,
  falcon,
  bloom,
];

/**
 * The families' names (Hugging Face model_type values, `init-model --arch` values), in the registry's order.
 * @example
 * familyNames().join('|') // 'gpt2|llama|mistral|…'
 */
export function familyNames(): string[] {
  return FAMILIES.map((f) => f.name);
}

/**
 * The family of a model_type, or undefined.
 * @example
 * familyNamed('qwen3')?.architecture // 'Qwen3ForCausalLM'
 */
export function familyNamed(name: unknown): Family | undefined {
  return FAMILIES.find((f) => f.name === name);
}

/**
 * The family a config belongs to; InvalidArgumentError when none does.
 * @example
 * familyOf(loadConfig('models/tiny')).name // 'llama'
 */
export function familyOf(c: ModelConfig): Family {
  const family = FAMILIES.find((f) => f.owns(c));
  if (!family) {
    const type = 'modelType' in c ? c.modelType : c.arch;
    throw new InvalidArgumentError(`model_type '${String(type)}' is not one of the families here (${familyNames().join(', ')})`);
  }
  return family;
}

/**
 * Checks a config: the sizes every config has, then its family's checks; throws InvalidArgumentError naming the field.
 * @example
 * validateConfig(gpt2Config({ hidden: 64, heads: 4 }))
 */
export function validateConfig(c: ModelConfig): ModelConfig {
  validateSizes(c);
  familyOf(c).validate(c);
  return c;
}

/**
 * Reads a Hugging Face config.json object (its model_type names the family). Every key is one the family reads, one
 * that changes nothing it computes, or a setting at the one value built here (config-keys.ts): any other is refused,
 * naming it, as is what the reader does not build.
 * @example
 * const config = configFromHF(JSON.parse(readFileSync('models/tiny/config.json', 'utf8')))
 */
export function configFromHF(raw: Json): ModelConfig {
  const family = familyNamed(raw.model_type);
  if (!family) throw new InvalidArgumentError(`model_type '${String(raw.model_type)}' is not supported (${familyNames().join(', ')})`);
  checkConfigKeys(raw, family.name, CONFIG_KEYS[family.name] ?? { read: [] });
  return validateConfig(family.fromHF(raw));
}

/**
 * Writes a config as Hugging Face's config.json object.
 * @example
 * writeFileSync('config.json', JSON.stringify(configToHF(model.config)))
 */
export function configToHF(c: ModelConfig): Json {
  return familyOf(c).toHF(c);
}

/**
 * Builds a model of a config's family: seeded random weights, or empty to be loaded; the whole model or a section.
 * @example
 * const model = buildModel(gpt2Config({ layers: 2, hidden: 64, heads: 4, vocabSize: 257 }), { seed: 1 })
 */
export function buildModel(c: ModelConfig, options: BuildOptions = {}): CausalLM {
  validateConfig(c);
  return familyOf(c).create(c, options);
}

/**
 * The family a GGUF file of architecture `arch` is read as, or undefined.
 * @example
 * ggufReader('qwen2')?.name // 'qwen2'
 */
export function ggufReader(arch: string): (Family & { gguf: GGUFArch }) | undefined {
  return FAMILIES.find((f): f is Family & { gguf: GGUFArch } => f.gguf?.reads === true && f.gguf.arch === arch);
}

/** The architectures GGUF files are read from, for messages. */
export function ggufReadArchs(): string[] {
  return FAMILIES.flatMap((f) => (f.gguf?.reads ? [f.gguf.arch] : []));
}

/** The families written to GGUF, by name, for messages. */
export function ggufWritten(): string[] {
  return FAMILIES.flatMap((f) => (f.gguf ? [f.name] : []));
}

export type { BuildOptions, CheckpointLayout, Family, GGUFArch, NamedShape, SmallShape } from './family.ts';
export { countParameters } from './family.ts';
