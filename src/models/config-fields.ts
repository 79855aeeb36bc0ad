import { InvalidArgumentError } from '../errors.ts';

/** Readers of config.json fields for the family files: one-line errors that name the key. */

type Json = Record<string, unknown>;

/** A number field, or `fallback` when it is absent or null (absent without a fallback: an error). */
export function num(raw: Json, key: string, fallback?: number): number {
  const v = raw[key];
  if (v === undefined || v === null) {
    if (fallback === undefined) throw new InvalidArgumentError(`config.json lacks '${key}'`);
    return fallback;
  }
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new InvalidArgumentError(`config.json '${key}' must be a number`);
  return v;
}

/** A token id field: a number, or the first of a list (eos_token_id may list several). */
export function firstId(v: unknown): number | undefined {
  if (typeof v === 'number') return v;
  if (Array.isArray(v) && typeof v[0] === 'number') return v[0];
  return undefined;
}

/**
 * What a family does with each key its config.json may hold (families/config-keys.ts lists them per family), beyond
 * the keys every config may hold (BOOKKEEPING_KEYS, TRAINING_ONLY_KEYS, COMMON_FIXED). checkConfigKeys refuses any
 * other key, naming it: a setting not classified here may change what transformers computes.
 */
export interface ConfigKeys {
  /** Keys the family's reader reads; it refuses, naming the key, the values it does not build. */
  read: readonly string[];
  /** Keys transformers 5.17 keeps for this family but computes nothing from (so the reader does not read them). */
  unused?: readonly string[];
  /** Settings that change the computation and are not built here: accepted only at the values listed (the default first). */
  fixed?: Readonly<Record<string, readonly unknown[]>>;
  /** Whether the reader takes partial_rotary_factor inside rope_scaling / rope_parameters (else it must equal the top-level one, or 1). */
  nestedPartialRotary?: boolean;
  /** Whether rope_parameters may hold one rotary per layer type (full_attention, sliding_attention). */
  ropePerLayerType?: boolean;
}

/** Keys that say nothing of what the model computes: names, versions, dtypes, labels, token ids, outputs, caching. */
export const BOOKKEEPING_KEYS: readonly string[] = [
  'architectures', 'model_type', 'transformers_version', '_name_or_path', 'name_or_path', '_commit_hash', 'dtype', 'torch_dtype',
  'use_bfloat16', 'auto_map', 'custom_pipelines', 'tokenizer_class', 'prefix', 'task_specific_params', 'finetuning_task', 'id2label',
  'label2id', 'num_labels', '_num_labels', 'problem_type', 'bos_token_id', 'eos_token_id', 'pad_token_id', 'sep_token_id', 'unk_token_id',
  'decoder_start_token_id', 'use_cache', 'output_attentions', 'output_hidden_states', 'return_dict', 'torchscript', 'tf_legacy_loss',
  'is_decoder', 'chunk_size_feed_forward', 'tie_encoder_decoder', 'cross_attention_hidden_size', 'gradient_checkpointing',
  'attn_implementation', '_attn_implementation', '_attn_implementation_autoset', '_attn_implementation_internal', 'experts_implementation',
  // generate()'s defaults, which transformers 5 pops from a model's config (they are not the model's computation)
  'max_length', 'min_length', 'max_new_tokens', 'min_new_tokens', 'do_sample', 'early_stopping', 'num_beams', 'num_beam_groups',
  'diversity_penalty', 'temperature', 'top_k', 'top_p', 'typical_p', 'repetition_penalty', 'length_penalty', 'no_repeat_ngram_size',
  'encoder_no_repeat_ngram_size', 'bad_words_ids', 'num_return_sequences', 'output_scores', 'output_logits', 'return_dict_in_generate',
  'forced_bos_token_id', 'forced_eos_token_id', 'remove_invalid_values', 'exponential_decay_length_penalty', 'suppress_tokens',
  'begin_suppress_tokens', 'cache_implementation',
];

/**
 * Dropout probabilities: transformers applies them only in training (model.train()). No model here builds dropout, so
 * inference is transformers' whatever they say; training runs without it (as transformers with them at 0).
 */
export const TRAINING_ONLY_KEYS: readonly string[] = [
  'attention_dropout', 'hidden_dropout', 'resid_pdrop', 'embd_pdrop', 'attn_pdrop', 'classifier_dropout', 'summary_first_dropout',
  'attention_probs_dropout_prob', 'hidden_dropout_prob',
];

/** Settings of every family that change the computation and are not built here: the values accepted. */
export const COMMON_FIXED: Readonly<Record<string, readonly unknown[]>> = {
  // quantized weights (bitsandbytes, GPTQ, AWQ, ...): the GGUF reader takes llama.cpp's quantizations instead
  quantization_config: [null],
  pruned_heads: [{}, null],
  add_cross_attention: [false],
  is_encoder_decoder: [false],
  // per-layer overrides of the config (heterogeneous blocks)
  per_layer_config: [null],
};

const BOOKKEEPING = new Set(BOOKKEEPING_KEYS);
const TRAINING_ONLY = new Set(TRAINING_ONLY_KEYS);

/** The keys a rope_scaling / rope_parameters object may hold (ropeFromHF reads them; longrope's factors name a type it refuses). */
const ROPE_KEYS = new Set([
  'rope_type', 'type', 'factor', 'rope_theta', 'original_max_position_embeddings', 'low_freq_factor', 'high_freq_factor',
  'attention_factor', 'beta_fast', 'beta_slow', 'mscale', 'mscale_all_dim', 'truncate', 'partial_rotary_factor', 'short_factor',
  'long_factor',
]);
const LAYER_TYPES = new Set(['full_attention', 'sliding_attention']);

/** A value as a message shows it: JSON, at most 40 characters. */
function shown(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 40 ? `${s.slice(0, 39)}…` : s;
}

function notImplemented(family: string, field: string, value: unknown, allowed?: readonly unknown[]): InvalidArgumentError {
  const only = allowed ? ` (${allowed.map(shown).join(' or ')} only)` : '';
  return new InvalidArgumentError(
    `${family} config field '${field}' (= ${shown(value)}) is not implemented${only}; TensorLink cannot compute this model as transformers does`,
    { details: { family, field } },
  );
}

const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The keys of one rotary's object; its partial_rotary_factor only where the reader takes it, or as the top level's. */
function checkRope(raw: Json, family: string, where: string, rope: unknown, keys: ConfigKeys): void {
  if (!isObject(rope)) return; // the reader refuses what is not an object
  for (const [k, v] of Object.entries(rope)) if (v !== undefined && !ROPE_KEYS.has(k)) throw notImplemented(family, `${where}.${k}`, v);
  const partial = rope.partial_rotary_factor;
  const top = raw.partial_rotary_factor ?? 1;
  if (!keys.nestedPartialRotary && partial !== undefined && partial !== null && partial !== top) {
    throw notImplemented(family, `${where}.partial_rotary_factor`, partial, [top]);
  }
}

/**
 * Refuses a config.json key of `family` that is not classified in `keys` or the lists every family shares, and a fixed
 * setting at another value, naming the key (InvalidArgumentError, one line). Keys the reader reads are left to it,
 * but for what the rotary's objects hold. Absent (undefined) values are skipped.
 * @example
 * checkConfigKeys({ model_type: 'x', foo: 3 }, 'x', { read: ['model_type'] }) // throws: x config field 'foo' (= 3) is not implemented; …
 */
export function checkConfigKeys(raw: Json, family: string, keys: ConfigKeys): void {
  const read = new Set(keys.read);
  const unused = new Set(keys.unused ?? []);
  const fixed = { ...COMMON_FIXED, ...keys.fixed };
  // transformers takes rope_scaling over rope_parameters; a reader may take either (one per layer type): not both unless equal
  const { rope_scaling: scaling, rope_parameters: params } = raw;
  if (isObject(scaling) && isObject(params) && JSON.stringify(scaling) !== JSON.stringify(params)) {
    throw notImplemented(family, 'rope_parameters', params, [scaling]);
  }
  for (const [key, value] of Object.entries(raw)) {
    if (value === undefined || BOOKKEEPING.has(key) || TRAINING_ONLY.has(key) || unused.has(key)) continue;
    if (read.has(key)) {
      if (key !== 'rope_scaling' && key !== 'rope_parameters') continue;
      const perType = keys.ropePerLayerType && key === 'rope_parameters' && isObject(value) && Object.keys(value).some((k) => LAYER_TYPES.has(k));
      if (!perType) checkRope(raw, family, key, value, keys);
      else {
        for (const [type, rope] of Object.entries(value as Json)) {
          if (!LAYER_TYPES.has(type)) throw notImplemented(family, `${key}.${type}`, rope);
          checkRope(raw, family, `${key}.${type}`, rope, keys);
        }
      }
      continue;
    }
    if (!Object.hasOwn(fixed, key)) throw notImplemented(family, key, value);
    const allowed = fixed[key];
    if (!allowed.some((a) => JSON.stringify(a) === JSON.stringify(value))) throw notImplemented(family, key, value, allowed);
  }
}
