import { InvalidArgumentError } from '../errors.ts';
import {
  adaptModel, type Adaptable, adapterParameters, adapterState, createModel, type LayerProfile, loadAdapter, type LoraConfig,
  type ModelConfig, type ModelLayer, readAdapterConfig, type SectionRange,
} from '../models/index.ts';
import type { WireAdapter } from '../p2p/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { joinSources, tensorSource } from './section-source.ts';
import type { JobAdapter, UserModel } from './user-model.ts';

export type { JobAdapter } from './user-model.ts';

/**
 * A LoRA adapter trained (or run) across workers: what `distribute(…, { adapter })` takes. New factors from a config
 * (PEFT's initialisation, each layer's drawn from `seed` and its path, so that any cut of the model draws what one
 * process draws), or a PEFT adapter folder to go on from.
 */
export type AdapterOption = (LoraConfig & { seed?: number }) | string;

export function jobAdapter(option: AdapterOption): JobAdapter {
  const config = typeof option === 'string' ? readAdapterConfig(option) : option;
  if (typeof config.targets === 'string') {
    throw new InvalidArgumentError(`an adapter across workers names its target modules (a list), not a regular expression ('${config.targets}')`);
  }
  const targets = [...config.targets];
  const wire: WireAdapter = { r: config.r, alpha: config.alpha, targets, rslora: config.rslora === true };
  return {
    config: { ...config, targets },
    dir: typeof option === 'string' ? option : null,
    seed: typeof option === 'string' ? 0 : option.seed ?? 0,
    wire,
  };
}

/** Puts the job's adapter on a part of the model (its base frozen): PEFT's factors from its folder, or new ones. */
export function putAdapter(model: Adaptable, adapter: JobAdapter): void {
  if (adapter.dir) loadAdapter(model, adapter.dir, { part: true });
  else adaptModel(model, adapter.config, { seed: adapter.seed, part: true });
}

/**
 * The user's model with the job's adapter: its ends carry it (and are frozen otherwise), each section's source lists
 * its factors (float32, `<module>.lora_A.weight`) beside the base's weights, and a plan counts each layer's factors.
 * The factors of a section are drawn (or read) once per range, on a section built empty (its base never resident).
 * Over a hosted base (`adapter.base`), a section's source is its factors alone: the hosts hold the base.
 */
export function withAdapter(source: UserModel, adapter: JobAdapter): UserModel {
  // over a hosted base (adapter.base), a section is its factors alone
  const shared = adapter.base !== undefined;
  if (source.ends) putAdapter(source.ends, adapter);
  const perBlock = blockFactorBytes(source.config, adapter.config);
  const factors = new Map<string, Map<string, Tensor>>();
  const factorsOf = (range: SectionRange) => {
    const key = String(range);
    let f = factors.get(key);
    if (!f) {
      const part = createModel(source.config, { section: range as [number, number], init: false });
      putAdapter(part, adapter);
      f = adapterState(part);
      factors.set(key, f);
    }
    return f;
  };
  return {
    ...source,
    layers: source.layers.map((layer) => withFactors(layer, perBlock)),
    section: (range) => (shared ? tensorSource(factorsOf(range)) : joinSources(source.section(range), tensorSource(factorsOf(range)))),
    adapter,
    close: () => source.close(),
  };
}

/**
 * The bytes of the factors an adapter puts on a block of the model (float32), from the names and shapes of the first
 * block built empty: what a plan adds to each block of a LoRA job (the targets are the blocks' projections).
 */
export function blockFactorBytes(config: ModelConfig, adapter: LoraConfig): number {
  return 4 * adapterParameters(createModel(config, { section: [1, 2], init: false }).hfStateDict(), adapter);
}

/** A layer as a plan weighs it in a LoRA job: a block's bytes with the adapter's factors on top. */
function withFactors(layer: ModelLayer, bytes: number): ModelLayer {
  const base = layer.profile();
  const profile: LayerProfile = { ...base, bytes: base.bytes + (layer.kind === 'block' ? bytes : 0) };
  return {
    name: layer.name, kind: layer.kind, blockIndex: layer.blockIndex,
    namedParameters: () => layer.namedParameters(), forward: (x, ctx) => layer.forward(x, ctx), profile: () => profile,
  };
}
