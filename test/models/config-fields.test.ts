// Every key of every family's config.json is read by its reader, changes nothing it computes, or is refused naming
// it (src/models/config-fields.ts, src/models/families/config-keys.ts): the fixtures transformers wrote, and the
// configs the project writes, walked key by key; an unknown key, a fixed setting at another value, a rotary's key
// the reader does not take, and the settings the readers refuse, each refused in one line that names it.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { BOOKKEEPING_KEYS, COMMON_FIXED, type ConfigKeys, TRAINING_ONLY_KEYS } from '../../src/models/config-fields.ts';
import { CONFIG_KEYS } from '../../src/models/families/config-keys.ts';
import { configFromHF, configToHF, FAMILIES, type Family } from '../../src/models/index.ts';
import { HF_FIXTURES } from '../helpers/hf-fixtures.ts';

type Json = Record<string, unknown>;

const COMMON = new Set([...BOOKKEEPING_KEYS, ...TRAINING_ONLY_KEYS]);

/** The family's keys, asserted listed. */
function keysOf(family: Family): ConfigKeys {
  const keys = CONFIG_KEYS[family.name];
  assert.ok(keys, `family '${family.name}' has its entry in families/config-keys.ts`);
  return keys;
}

/** A value as JSON carries it (undefined fields left out). */
const json = (v: unknown): Json => JSON.parse(JSON.stringify(v)) as Json;

/** Every fixed setting of the family, with the values accepted (the shared ones and its own). */
function fixedOf(keys: ConfigKeys): [string, readonly unknown[]][] {
  return Object.entries({ ...COMMON_FIXED, ...keys.fixed });
}

/**
 * The configs to walk: transformers' fixtures, each read and written back, init-model's shapes written (with a window
 * where the family takes one), and the first fixture with only the keys the reader needs.
 */
function configsOf(family: Family): { name: string; raw: Json }[] {
  const out = family.fixtures.map((name) => ({ name, raw: JSON.parse(readFileSync(join(HF_FIXTURES, name, 'config.json'), 'utf8')) as Json }));
  for (const { name, raw } of [...out]) out.push({ name: `${name}, written back`, raw: json(configToHF(configFromHF(raw))) });
  const base = { vocabSize: 257, hidden: 64, heads: 4, layers: 2, maxPositions: 64, bosTokenId: 256, eosTokenId: 256 };
  const small = (extra: { slidingWindow?: number }): Json | undefined => {
    for (const kvHeads of [2, 4]) {
      try {
        return json(configToHF(family.small({ ...base, kvHeads, ...extra })));
      } catch {
        // a flag this family has no use for: grouped heads, or a window
      }
    }
    return undefined;
  };
  for (const [name, raw] of [['init-model', small({})], ['init-model, windowed', small({ slidingWindow: 8 })]] as const) {
    if (raw) out.push({ name, raw });
  }
  // the fewest keys the reader asks for: the defaults' branches are read too
  const least: Json = { ...out[0].raw };
  for (const key of Object.keys(least)) {
    const without = { ...least };
    delete without[key];
    try {
      configFromHF(without);
      delete least[key];
    } catch {
      // a key it needs
    }
  }
  out.push({ name: `${out[0].name}, the keys needed only`, raw: least });
  return out;
}

/**
 * The keys `fromHF` reads from `raw` (gets, `in`, own-property checks, absent keys included), apart from those it only
 * copies whole (`{ ...raw }`), which are returned apart.
 */
function keysRead(family: Family, raw: Json): { read: Set<string>; copied: Set<string> } {
  const read = new Set<string>();
  const copied = new Set<string>();
  let copying: string[] = [];
  const proxy = new Proxy(raw, {
    ownKeys(target) {
      const keys = Reflect.ownKeys(target);
      copying = keys.filter((k): k is string => typeof k === 'string');
      return keys;
    },
    getOwnPropertyDescriptor(target, key) {
      if (typeof key === 'string' && copying[0] !== key) read.add(key);
      return Reflect.getOwnPropertyDescriptor(target, key);
    },
    get(target, key, receiver) {
      if (typeof key === 'string') {
        if (copying[0] === key) {
          copying.shift();
          copied.add(key);
        } else read.add(key);
      }
      return Reflect.get(target, key, receiver);
    },
    has(target, key) {
      if (typeof key === 'string') read.add(key);
      return Reflect.has(target, key);
    },
  });
  try {
    family.fromHF(proxy);
  } catch {
    // a refusal: what was read before it counts
  }
  return { read, copied };
}

/** Settings whose branches read keys no config above has: a scaling that reads the original context, a window, Falcon's older blocks. */
const PROBES: Json[] = [
  { rope_scaling: { rope_type: 'yarn', factor: 2 }, original_max_position_embeddings: 64 },
  { use_sliding_window: true },
  { new_decoder_architecture: false },
];

/** A one-line InvalidArgumentError naming the family and `field`. */
function refusedNaming(raw: Json, field: string, family: string): void {
  assert.throws(() => configFromHF(raw), (e: Error) => {
    assert.equal(e.name, 'InvalidArgumentError', `${field}: ${e.name}: ${e.message}`);
    assert.ok(e.message.startsWith(`${family} config field '${field}' (= `), `'${e.message}' names ${family} and ${field}`);
    assert.ok(!e.message.includes('\n'), `one line: ${JSON.stringify(e.message)}`);
    return true;
  });
}

/** A value other than the ones accepted. */
function otherThan(allowed: readonly unknown[]): unknown {
  if (typeof allowed[0] === 'boolean') return !allowed[0];
  if (typeof allowed[0] === 'number') return allowed[0] + 1;
  return { 0: [1] };
}

/** What each family's reader refuses, naming the field: a setting it does not build, with the word its message holds. */
const READER_REFUSALS: Record<string, [Json, string][]> = {
  gpt2: [[{ activation_function: 'relu' }, 'activation']],
  llama: [[{ hidden_act: 'gelu' }, 'hidden_act'], [{ partial_rotary_factor: 0.5 }, 'partial_rotary_factor'],
    [{ rope_scaling: { rope_type: 'longrope', short_factor: [1], long_factor: [1] } }, 'rope_scaling']],
  mistral: [[{ hidden_act: 'gelu' }, 'hidden_act'], [{ partial_rotary_factor: 0.5 }, 'partial_rotary_factor']],
  qwen2: [[{ hidden_act: 'gelu' }, 'hidden_act'], [{ layer_types: ['chunked_attention', 'full_attention'] }, 'layer_types']],
  qwen3: [[{ hidden_act: 'gelu' }, 'hidden_act'], [{ rope_scaling: { rope_type: 'hyperbolic', factor: 2 } }, 'rope_scaling']],
  phi3: [[{ hidden_act: 'gelu' }, 'hidden_act'], [{ rope_scaling: { rope_type: 'linear', factor: 2 } }, 'rope_scaling']],
  gemma2: [[{ hidden_activation: 'gelu' }, 'hidden_activation'], [{ use_bidirectional_attention: true }, 'use_bidirectional_attention']],
  gemma3_text: [[{ hidden_activation: 'gelu' }, 'hidden_activation'], [{ use_bidirectional_attention: true }, 'use_bidirectional_attention'],
    [{ rope_parameters: { sliding_attention: { rope_type: 'linear', factor: 2 } } }, 'rope_parameters.sliding_attention']],
  mixtral: [[{ output_router_logits: true }, 'output_router_logits'], [{ router_jitter_noise: 0.1 }, 'router_jitter_noise'], [{ hidden_act: 'gelu' }, 'hidden_act']],
  qwen3_moe: [[{ output_router_logits: true }, 'output_router_logits'], [{ hidden_act: 'gelu' }, 'hidden_act']],
  gpt_neox: [[{ hidden_act: 'relu' }, 'hidden_act'], [{ rotary_pct: 0.3125 }, 'rotary_pct']],
  falcon: [[{ alibi: true }, 'alibi'], [{ parallel_attn: false, new_decoder_architecture: false, num_kv_heads: 1 }, 'parallel_attn'],
    [{ activation: 'relu' }, 'activation'], [{ num_ln_in_parallel_attn: 3 }, 'num_ln_in_parallel_attn']],
  bloom: [[{ slow_but_exact: true, pretraining_tp: 2 }, 'slow_but_exact']],
};

describe('every field of every family\'s config.json is read, changes nothing computed, or is refused by name', () => {
  test('each family of the registry has its keys, each key in one class only', () => {
    assert.deepEqual(Object.keys(CONFIG_KEYS).sort(), FAMILIES.map((f) => f.name).sort());
    for (const family of FAMILIES) {
      const keys = keysOf(family);
      const classes: [string, readonly string[]][] = [
        ['read', keys.read],
        ['unused', keys.unused ?? []],
        ['fixed', Object.keys(keys.fixed ?? {})],
        ['shared', [...COMMON, ...Object.keys(COMMON_FIXED)]],
      ];
      const seen = new Map<string, string>();
      for (const [name, list] of classes) {
        for (const key of list) {
          assert.ok(!seen.has(key) || seen.get(key) === name, `${family.name}: '${key}' is both ${seen.get(key)} and ${name}`);
          seen.set(key, name);
        }
      }
    }
    assert.deepEqual(Object.keys(READER_REFUSALS).sort(), FAMILIES.map((f) => f.name).sort());
  });

  for (const family of FAMILIES) {
    describe(family.name, () => {
      const keys = keysOf(family);
      const classified = new Set([...keys.read, ...(keys.unused ?? []), ...fixedOf(keys).map(([k]) => k), ...COMMON]);
      const configs = configsOf(family);
      const fixture = configs[0].raw;

      test('every field of its fixtures and of the configs written here is classified, and loads', () => {
        for (const { name, raw } of configs) {
          for (const key of Object.keys(raw)) assert.ok(classified.has(key), `${name}: '${key}' is classified`);
          assert.doesNotThrow(() => configFromHF(raw), name);
        }
      });

      test('its reader reads no key but those listed as read, and each of them in some config', () => {
        const listed = new Set(keys.read);
        const touched = new Set<string>();
        const probes = PROBES.map((patch) => ({ name: `${configs[0].name} with ${JSON.stringify(patch)}`, raw: { ...fixture, ...patch } }));
        for (const { name, raw } of [...configs, ...probes]) {
          const { read, copied } = keysRead(family, raw);
          for (const key of read) assert.ok(listed.has(key) || BOOKKEEPING_KEYS.includes(key), `${name}: the reader reads '${key}', not listed as read`);
          for (const key of [...read, ...copied]) touched.add(key);
        }
        assert.deepEqual(keys.read.filter((k) => !touched.has(k)), [], 'keys listed as read that no config had read');
      });

      test('an unknown field is refused, naming it and the family', () => {
        refusedNaming({ ...fixture, tensorlink_unknown_field: 3 }, 'tensorlink_unknown_field', family.name);
        refusedNaming({ ...fixture, hidden_size_typo: null }, 'hidden_size_typo', family.name);
        assert.throws(() => configFromHF({ ...fixture, foo_bar: 3 }), {
          name: 'InvalidArgumentError',
          message: `${family.name} config field 'foo_bar' (= 3) is not implemented; TensorLink cannot compute this model as transformers does`,
        });
      });

      test('each fixed setting at another value is refused naming it; at its own, it loads', () => {
        for (const [key, allowed] of fixedOf(keys)) {
          refusedNaming({ ...fixture, [key]: otherThan(allowed) }, key, family.name);
          for (const value of allowed) assert.doesNotThrow(() => configFromHF({ ...fixture, [key]: value }), `${key}: ${JSON.stringify(value)}`);
        }
      });

      test('the rotary\'s objects: a key the reader does not take is refused naming it', { skip: !keys.read.includes('rope_scaling') }, () => {
        refusedNaming({ ...fixture, rope_scaling: { rope_type: 'default', tensorlink_unknown: 1 } }, 'rope_scaling.tensorlink_unknown', family.name);
        const partial = { ...fixture, rope_scaling: null, rope_parameters: { rope_type: 'default', partial_rotary_factor: 0.5 } };
        if (keys.nestedPartialRotary) assert.doesNotThrow(() => configFromHF(partial));
        else refusedNaming(partial, 'rope_parameters.partial_rotary_factor', family.name);
        const perType = { ...fixture, rope_scaling: null, rope_parameters: { full_attention: { rope_type: 'default' }, local_attention: {} } };
        refusedNaming(perType, keys.ropePerLayerType ? 'rope_parameters.local_attention' : 'rope_parameters.full_attention', family.name);
        const both = { ...fixture, rope_scaling: { rope_type: 'linear', factor: 2 }, rope_parameters: { full_attention: { rope_type: 'default' } } };
        refusedNaming(both, 'rope_parameters', family.name);
      });

      test('the settings its reader does not build are refused naming them', () => {
        for (const [patch, word] of READER_REFUSALS[family.name]) {
          const named = (e: Error) => e.name === 'InvalidArgumentError' && e.message.includes(word) && !e.message.includes('\n');
          assert.throws(() => configFromHF({ ...fixture, ...patch }), named, `${family.name}: ${JSON.stringify(patch)}`);
        }
      });
    });
  }

  test('a refusal carries the family and the field in its details', () => {
    const raw = JSON.parse(readFileSync(join(HF_FIXTURES, 'llama', 'config.json'), 'utf8')) as Json;
    assert.throws(() => configFromHF({ ...raw, quantization_config: { quant_method: 'gptq' } }), (e: Error & { details?: Json }) => {
      assert.deepEqual(e.details, { family: 'llama', field: 'quantization_config' });
      const named = /^llama config field 'quantization_config' \(= \{"quant_method":"gptq"\}\) is not implemented \(null only\); /;
      assert.match(e.message, named);
      return true;
    });
  });
});
