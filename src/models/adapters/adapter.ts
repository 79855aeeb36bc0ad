import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { FileNotFoundError, InvalidArgumentError, StateDictError } from '../../errors.ts';
import { readSafetensors, writeSafetensors } from '../../io/index.ts';
import { Linear, type Lora, LORA_PARAM_PREFIX, type Module, newLora } from '../../nn/index.ts';
import { Generator, noGrad, type Tensor } from '../../tensor/index.ts';

/**
 * LoRA adapters in PEFT's layout (adapter_config.json, adapter_model.safetensors with the keys
 * `base_model.model.<module>.lora_A.weight` and `.lora_B.weight`): put on a model's projections, the base frozen, so
 * that only the adapters train; loaded from PEFT's files, saved as PEFT saves them, merged into the base.
 */

/** What an adapter is: its rank, alpha (the scale is alpha / r, or alpha / √r with rsLoRA) and the modules it adapts. */
export interface LoraConfig {
  r: number;
  alpha: number;
  /** Module names (a module whose path is one, or ends with '.' and one, as PEFT matches), or a regular expression over the path. */
  targets: string[] | string;
  rslora?: boolean;
}

/** A model (or a section of one) whose layers are named as in its checkpoint. */
export type Adaptable = Module & { hfStateDict(): Map<string, Tensor> };

/** The usual targets: the attention's and the MLP's projections of the shared decoder's families. */
export const DEFAULT_LORA_TARGETS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'];
export const ADAPTER_CONFIG = 'adapter_config.json';
export const ADAPTER_WEIGHTS = 'adapter_model.safetensors';
/** What PEFT puts before a module's path in its file's keys. */
const PEFT_PREFIX = LORA_PARAM_PREFIX;

/** The scale an adapter's product is multiplied by. */
export function loraScale(c: LoraConfig): number {
  return c.rslora ? c.alpha / Math.sqrt(c.r) : c.alpha / c.r;
}

/**
 * `lora[:r=8,alpha=16,targets=q_proj,v_proj]` (the `--adapter` of `train`): rank 8, alpha 16 and DEFAULT_LORA_TARGETS
 * unless given; a name after `targets=` without '=' is one more target.
 */
export function parseLoraSpec(text: string): LoraConfig {
  const [kind, rest] = text.split(/:(.*)/s, 2);
  if (kind !== 'lora') throw new InvalidArgumentError(`--adapter '${text}': the adapter kind is lora (lora[:r=8,alpha=16,targets=q_proj,v_proj])`);
  const c: LoraConfig = { r: 8, alpha: 16, targets: DEFAULT_LORA_TARGETS };
  let inTargets = false;
  const targets: string[] = [];
  for (const part of (rest ?? '').split(',').map((p) => p.trim()).filter((p) => p.length > 0)) {
    const eq = part.indexOf('=');
    if (eq < 0) {
      if (!inTargets) throw new InvalidArgumentError(`--adapter '${text}': '${part}' is not KEY=VALUE (r, alpha, targets, rslora)`);
      targets.push(part);
      continue;
    }
    const [key, value] = [part.slice(0, eq), part.slice(eq + 1)];
    inTargets = key === 'targets';
    if (key === 'r') c.r = positiveInt(value, 'r');
    else if (key === 'alpha') c.alpha = positive(value, 'alpha');
    else if (key === 'rslora') c.rslora = value === 'true' || value === '1';
    else if (key === 'targets') targets.push(...(value ? [value] : []));
    else throw new InvalidArgumentError(`--adapter '${text}': unknown key '${key}' (r, alpha, targets, rslora)`);
  }
  if (targets.length > 0) c.targets = targets;
  return c;
}

function positiveInt(v: string, what: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`the adapter's ${what} must be a whole number ≥ 1, got '${v}'`);
  return n;
}

function positive(v: string, what: string): number {
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError(`the adapter's ${what} must be a positive number, got '${v}'`);
  return n;
}

/** Reads PEFT's adapter_config.json; what this project cannot compute (DoRA, biases, per-layer ranks, …) is a clear error. */
export function readAdapterConfig(dir: string): LoraConfig {
  const path = join(dir, ADAPTER_CONFIG);
  if (!existsSync(path)) throw new FileNotFoundError(`${dir} holds no ${ADAPTER_CONFIG}: not a PEFT adapter folder`);
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
  } catch (err) {
    throw new InvalidArgumentError(`${path} is not JSON: ${(err as Error).message}`);
  }
  const fail = (what: string) => {
    throw new InvalidArgumentError(`${path}: ${what}`);
  };
  if (raw.peft_type !== 'LORA') fail(`peft_type is '${String(raw.peft_type)}'; only LORA adapters are supported`);
  if (raw.use_dora === true) fail('DoRA adapters (use_dora) are not supported');
  if (raw.bias !== undefined && raw.bias !== 'none') fail(`bias '${String(raw.bias)}' is not supported (only 'none')`);
  if (raw.lora_bias === true) fail('lora_bias is not supported');
  for (const key of ['rank_pattern', 'alpha_pattern']) {
    const v = raw[key];
    if (v && typeof v === 'object' && Object.keys(v).length > 0) fail(`${key} (a rank or alpha per module) is not supported`);
  }
  for (const key of ['layers_to_transform', 'modules_to_save', 'target_parameters', 'trainable_token_indices']) {
    if (raw[key] !== undefined && raw[key] !== null) fail(`${key} is not supported`);
  }
  const r = raw.r;
  const alpha = raw.lora_alpha;
  if (typeof r !== 'number' || !Number.isInteger(r) || r < 1) fail(`r must be a whole number ≥ 1, got ${JSON.stringify(r)}`);
  if (typeof alpha !== 'number' || !(alpha > 0)) fail(`lora_alpha must be a positive number, got ${JSON.stringify(alpha)}`);
  const t = raw.target_modules;
  const targets = typeof t === 'string' ? t : Array.isArray(t) && t.every((x) => typeof x === 'string') && t.length > 0 ? (t as string[]) : null;
  if (targets === null) fail('target_modules must be a list of module names or a regular expression');
  return { r: r as number, alpha: alpha as number, targets: targets!, rslora: raw.use_rslora === true };
}

/** Whether PEFT would adapt the module at `path`: a list matches the path or its end after a '.'; a string is a regex over the path. */
export function targeted(path: string, targets: string[] | string): boolean {
  if (typeof targets === 'string') return new RegExp(`^(?:${targets})$`).test(path);
  return targets.some((t) => path === t || path.endsWith(`.${t}`));
}

/**
 * Each Linear of the model under its checkpoint (Hugging Face) path, the name PEFT knows it by: its weight's
 * checkpoint name without `.weight`.
 */
function linearsByPath(model: Adaptable): Map<string, Linear> {
  const nameOf = new Map<Tensor, string>();
  for (const [name, t] of model.hfStateDict()) if (!nameOf.has(t)) nameOf.set(t, name);
  const out = new Map<string, Linear>();
  for (const [, m] of model.namedModules()) {
    if (!(m instanceof Linear)) continue;
    const name = nameOf.get(m.weight);
    if (name?.endsWith('.weight')) out.set(name.slice(0, -'.weight'.length), m);
  }
  return out;
}

/**
 * Puts new LoRA factors (PEFT's initialisation: A uniform, B zero; each layer's drawn from `seed` and its path) on every Linear `config`
 * targets and freezes every other parameter of the model, base weights and ends alike. Returns the adapted modules'
 * paths. A config that targets nothing in this model (or this part of it) is an error for a whole model only.
 */
export function adaptModel(
  model: Adaptable, config: LoraConfig, options: { seed?: number; part?: boolean } = {},
): string[] {
  const adapted: string[] = [];
  for (const p of model.parameters()) p.requiresGrad = false;
  const scale = loraScale(config);
  for (const [path, layer] of linearsByPath(model)) {
    if (!targeted(path, config.targets)) continue;
    // each layer's factors are drawn from the seed and its path alone: a section of the model draws what the whole does
    layer.adapt(newLora(layer.inFeatures, layer.outFeatures, config.r, scale, new Generator(layerSeed(options.seed ?? 0, path))));
    adapted.push(path);
  }
  if (adapted.length === 0 && !options.part) {
    throw new InvalidArgumentError(`the adapter's targets (${String(config.targets)}) name no linear layer of this model`);
  }
  return adapted;
}

/**
 * The parameters an adapter puts on a layer, from its weights' names and shapes alone (nothing is built): r × (in + out)
 * for each matrix it targets. What a plan counts for a layer of a LoRA job.
 */
export function adapterParameters(named: Iterable<readonly [string, { shape: readonly number[] }]>, config: LoraConfig): number {
  let n = 0;
  for (const [name, t] of named) {
    if (t.shape.length !== 2 || !name.endsWith('.weight') || !targeted(name.slice(0, -'.weight'.length), config.targets)) continue;
    n += config.r * (t.shape[0] + t.shape[1]);
  }
  return n;
}

/** A 32-bit seed for the factors of the layer at `path` (FNV-1a over the path, mixed with the adapter's seed). */
function layerSeed(seed: number, path: string): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < path.length; i++) h = Math.imul(h ^ path.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/**
 * The adapter's weights under PEFT's file keys (`base_model.model.<module>.lora_A.weight`, `.lora_B.weight`): the names
 * the model's namedParameters() gives them, what travels to a worker beside the base, and what it trains.
 */
export function adapterState(model: Adaptable): Map<string, Tensor> {
  const out = new Map<string, Tensor>();
  for (const [path, layer] of linearsByPath(model)) {
    if (!layer.lora) continue;
    out.set(`${PEFT_PREFIX}${path}.lora_A.weight`, layer.lora.A.weight);
    out.set(`${PEFT_PREFIX}${path}.lora_B.weight`, layer.lora.B.weight);
  }
  return out;
}

/** The bytes of a model's adapter factors (float32). */
export function adapterBytes(model: Adaptable): number {
  return [...adapterState(model).values()].reduce((sum, t) => sum + 4 * t.size, 0);
}

/** Whether a weight's name is an adapter factor's (adapterState). */
export function isAdapterWeight(name: string): boolean {
  return /\.lora_[AB]\.weight$/.test(name);
}

/** A model's weights with its adapter's: the base under its checkpoint names, the factors under adapterState' names. */
export function weightsWithAdapter(model: Adaptable): Map<string, Tensor> {
  return new Map([...model.hfStateDict(), ...adapterState(model)]);
}

/**
 * Loads a PEFT adapter folder onto the model: its config adapts the model (adaptModel) and its weights fill the
 * factors, key for key (a key missing or left over, or a shape that differs, is a StateDictError). With `part` (a
 * section of the model) the keys of other sections are skipped.
 */
export function loadAdapter(model: Adaptable, dir: string, options: { part?: boolean } = {}): LoraConfig {
  const config = readAdapterConfig(dir);
  const path = join(dir, ADAPTER_WEIGHTS);
  if (!existsSync(path)) throw new FileNotFoundError(`${dir} holds no ${ADAPTER_WEIGHTS}`);
  const file = readSafetensors(path);
  adaptModel(model, config, options);
  const own = adapterState(model);
  const missing = [...own.keys()].filter((k) => !file.has(k));
  const unexpected = options.part ? [] : [...file.keys()].filter((k) => !own.has(k));
  if (missing.length > 0 || unexpected.length > 0) {
    throw new StateDictError(
      `the adapter in ${dir} does not fit this model: missing [${missing.slice(0, 4).join(', ')}], unexpected [${unexpected.slice(0, 4).join(', ')}]`,
      { details: { missing, unexpected } },
    );
  }
  noGrad(() => {
    for (const [key, target] of own) {
      const t = file.get(key)!;
      if (t.shape.join() !== target.shape.join()) {
        throw new StateDictError(`'${key}' has shape [${t.shape}] in the adapter, the model's is [${target.shape}]`);
      }
      target.data.set(t.dtype === 'float32' ? t.data : t.to('float32').data);
    }
  });
  return config;
}

/**
 * Writes the model's adapter as PEFT does: adapter_config.json (PEFT's LoraConfig fields) and
 * adapter_model.safetensors (float32, PEFT's keys). `base`: what base_model_name_or_path names.
 */
export function saveAdapter(model: Adaptable, config: LoraConfig, dir: string, base = ''): void {
  writeAdapter(adapterState(model), config, dir, base);
}

/** Writes an adapter's weights (under PEFT's keys) and config in PEFT's layout: what saveAdapter writes of a model. */
export function writeAdapter(state: Map<string, Tensor>, config: LoraConfig, dir: string, base = ''): void {
  if (state.size === 0) throw new InvalidArgumentError('the model has no adapter to save');
  mkdirSync(dir, { recursive: true });
  const peft = {
    alpha_pattern: {}, auto_mapping: null, base_model_name_or_path: base, bias: 'none', fan_in_fan_out: false, inference_mode: true,
    init_lora_weights: true, layers_pattern: null, layers_to_transform: null, lora_alpha: config.alpha, lora_bias: false,
    lora_dropout: 0, modules_to_save: null, peft_type: 'LORA', r: config.r, rank_pattern: {}, revision: null,
    target_modules: config.targets, task_type: 'CAUSAL_LM', use_dora: false, use_rslora: config.rslora === true,
  };
  writeFileSync(join(dir, ADAPTER_CONFIG), `${JSON.stringify(peft, null, 2)}\n`);
  writeSafetensors(join(dir, ADAPTER_WEIGHTS), state, { metadata: { format: 'pt' } });
}

/**
 * Folds every adapter into its layer's weight (W ← W + scale · B A) and takes the factors away: the model computes
 * what it computed with them, as one plain model. The base must be float32 (a packed base is merged after loading it
 * at float32).
 */
export function mergeAdapter(model: Module): number {
  let merged = 0;
  noGrad(() => {
    for (const [, m] of model.namedModules()) {
      if (!(m instanceof Linear) || !m.lora) continue;
      if (m.weight.packed) throw new InvalidArgumentError('an adapter merges into a float32 base: load the model without --quantize/--dtype to merge');
      const { A, B, scale } = m.lora;
      const delta = B.weight.matmul(A.weight).data;
      const w = m.weight.data;
      for (let i = 0; i < w.length; i++) w[i] += scale * delta[i];
      m.unadapt();
      merged++;
    }
  });
  return merged;
}

/**
 * Several PEFT adapters over one model, one in use at a time (`serve --adapter NAME=DIR`): each is loaded once and its
 * factors kept; `use(name)` puts that adapter's factors on their layers (and takes the one before off), `use(null)`
 * leaves the base alone. The base is held once, frozen; switching moves no weights.
 */
export class AdapterSet {
  private readonly adapters = new Map<string, Map<Linear, Lora>>();
  private active: string | null = null;

  constructor(private readonly model: Adaptable) {}

  get names(): string[] {
    return [...this.adapters.keys()];
  }

  /** Loads the PEFT adapter in `dir` under `name` (its factors are kept aside until it is used). */
  add(name: string, dir: string): LoraConfig {
    if (this.adapters.has(name)) throw new InvalidArgumentError(`two adapters are named '${name}'`);
    this.use(null);
    const config = loadAdapter(this.model, dir);
    const factors = new Map<Linear, Lora>();
    for (const [, m] of this.model.namedModules()) {
      if (m instanceof Linear && m.lora) {
        factors.set(m, m.lora);
        m.unadapt();
      }
    }
    this.adapters.set(name, factors);
    return config;
  }

  /** Puts adapter `name` on the model (null: none). */
  use(name: string | null): void {
    if (name === this.active) return;
    if (name !== null && !this.adapters.has(name)) throw new InvalidArgumentError(`no adapter is named '${name}' (${this.names.join(', ') || 'none loaded'})`);
    if (this.active !== null) for (const layer of this.adapters.get(this.active)!.keys()) layer.unadapt();
    this.active = null;
    if (name === null) return;
    for (const [layer, lora] of this.adapters.get(name)!) layer.adapt(lora);
    this.active = name;
  }
}
