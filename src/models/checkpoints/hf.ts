import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { FileNotFoundError, InvalidArgumentError, StateDictError } from '../../errors.ts';
import { Checkpoint, INDEX_FILE, planShards, SafetensorsWriter, writeCheckpoint, writeShardIndex } from '../../io/index.ts';
import {
  formatBytes, holdPacked, noGrad, packedBytes, packWeight, packWeightRows, type QuantFormat, Tensor, unpackMatrix, type WeightFormat,
} from '../../tensor/index.ts';
import type { ModelConfig } from '../config.ts';
import { buildModel, configFromHF, configToHF, familyOf } from '../families/index.ts';
import { canonicalName, ignorableKey, layersOfWeight } from './checkpoint-weights.ts';
import { type CausalLM, type ModelLayer, type ModelPart, partLayers } from '../model.ts';
import { GGUFModel } from './gguf-model.ts';
import { loadAdapter } from '../adapters/adapter.ts';
import { HFTokenizer, type Tokenizer } from '../tokenizer.ts';

/**
 * Builds a randomly initialised model; the same seed gives the same weights everywhere.
 * @example
 * const model = createModel(loadConfig('models/tiny'), { seed: 1 })
 */
export function createModel(config: ModelConfig, options: { seed?: number; init?: boolean; section?: ModelPart } = {}): CausalLM {
  return buildModel(config, options); // its family's model (families/index.ts)
}

/**
 * Every layer of a model (names and profiles, for planning and budgets) without allocating its
 * weights: only the final norm is built.
 */
export function modelLayers(config: ModelConfig): readonly ModelLayer[] {
  return createModel(config, { section: [config.layers + 1, config.layers + 2] }).wholeLayers;
}

/** Bytes of the weights of a part of a model at float32 (a head tied to an embedding of the same part counted once). */
export function partBytes(config: ModelConfig, part: ModelPart): number {
  const layers = modelLayers(config);
  const held = partLayers(layers, part);
  let bytes = held.reduce((sum, l) => sum + l.profile().bytes, 0);
  const head = layers[layers.length - 1];
  if (config.tieWordEmbeddings && held.includes(layers[0]) && held.includes(head)) bytes -= head.profile().bytes;
  return bytes;
}

function readJson(path: string, what: string): Record<string, unknown> {
  if (!existsSync(path)) throw new FileNotFoundError(`${what} not found: ${path}`);
  try {
    const value = JSON.parse(readFileSync(path, 'utf8'));
    if (typeof value !== 'object' || value === null) throw new Error('not an object');
    return value as Record<string, unknown>;
  } catch (cause) {
    throw new InvalidArgumentError(`${path} is not a valid JSON object`, { cause });
  }
}

/**
 * Loads a Hugging Face model directory: config.json, model.safetensors or a sharded
 * index, and tokenizer.json when present. Key sets and shapes are checked; errors name
 * the key. With `part`, only that part is built and read (a worker's section, or the user's
 * ends): the rest of the checkpoint stays on disk. With `dtype: 'bf16'` or `quantize`, its matrices are held in
 * that compact format (see compactWeights), packed one tensor at a time as they are read, so the model never sits
 * in float32 first; they are frozen.
 * @example
 * const model = await loadModel('models/tiny')
 * const ends = await loadModel('models/big', { part: 'ends' })   // embedding, final norm, head
 * const small = await loadModel('models/big', { quantize: 'int4' })   // about 0.16 of the float32 bytes
 */
export async function loadModel(dir: string, options: LoadOptions = {}): Promise<CausalLM> {
  if (isGGUF(dir)) {
    const model = await loadGGUF(dir, options);
    if (options.adapter) loadAdapter(model, options.adapter, { part: options.part !== undefined });
    return model;
  }
  const config = loadConfig(dir);
  const part = options.part;
  const format = weightFormat(options);
  const model = createModel(config, { init: false, section: part }); // every weight comes from the checkpoint
  const own = model.hfStateDict();
  const expected = new Set(own.keys());
  const ckpt = Checkpoint.open(dir);
  try {
    const seen = new Set<string>();
    const unexpected: string[] = [];
    noGrad(() => {
      for (const raw of ckpt.keys()) {
        if (ignorableKey(raw, config.tieWordEmbeddings, familyOf(config).layout.head)) continue;
        const key = canonicalName(config, raw);
        const target = own.get(key);
        if (target === undefined) {
          // a part skips the weights of other layers; a name no layer has is unexpected either way
          if (!part || layersOfWeight(config, key).length === 0) unexpected.push(raw);
          continue;
        }
        const info = ckpt.info(raw);
        if (info.shape.length !== target.ndim || info.shape.some((d, i) => d !== target.shape[i])) {
          throw new StateDictError(`'${raw}' has shape [${info.shape}] in the checkpoint, the config implies [${target.shape}]`, {
            details: { key: raw },
          });
        }
        if (format && compactWeight(key, target.shape)) {
          // a few rows at a time, through one buffer: not even this weight sits in float32 whole
          const scratch = new Float32Array(PACK_ROWS * target.shape[1]);
          packWeightRows(target, format, (start, count) => ckpt.readFloat32(raw, start, count, scratch), PACK_ROWS);
        } else {
          const t = ckpt.read(raw);
          target.data.set(t.dtype === 'float32' ? t.data : t.to('float32').data);
        }
        seen.add(key);
      }
    });
    const missing = [...expected].filter((k) => !seen.has(k));
    if (missing.length > 0 || unexpected.length > 0) {
      throw new StateDictError(
        `checkpoint in ${dir} does not match its config: missing [${missing.slice(0, 4).join(', ')}${missing.length > 4 ? ', ...' : ''}], unexpected [${unexpected.slice(0, 4).join(', ')}${unexpected.length > 4 ? ', ...' : ''}]`,
        { details: { missing, unexpected } },
      );
    }
  } finally {
    ckpt.close();
  }
  model.tokenizer = loadTokenizer(dir);
  if (options.adapter) loadAdapter(model, options.adapter, { part: part !== undefined });
  return model;
}

/** Rows of a weight read and packed at a time when a model is loaded compact. */
const PACK_ROWS = 256;

/** How a model is loaded: its part, and the format its matrices are held in. */
export interface LoadOptions {
  part?: ModelPart;
  /** bf16: matrices held as bfloat16 (half the float32 bytes), computed in float32. */
  dtype?: 'f32' | 'bf16';
  /** int8 or int4 blocks of 32 (llama.cpp's Q8_0 and Q4_0 values: 0.28 and 0.16 of the float32 bytes); wins over dtype. */
  quantize?: QuantFormat;
  /** A PEFT LoRA adapter folder put on the model (the base frozen; only the adapter trains): see adapter.ts. */
  adapter?: string;
}

/** The compact format LoadOptions ask for, or null for float32. */
export function weightFormat(options: Pick<LoadOptions, 'dtype' | 'quantize'>): WeightFormat | null {
  return options.quantize ?? (options.dtype === 'bf16' ? 'bf16' : null);
}

/**
 * Whether a weight is held compact when a format is asked for: every matrix (projections, embeddings, the head), but
 * not a mixture-of-experts router (`….gate.weight` of 'block_sparse_moe' or a MoE 'mlp'), whose top-k choice a rounding
 * would flip, as llama.cpp keeps its ffn_gate_inp in float32. Norms and biases stay float32.
 */
export function compactWeight(name: string, shape: readonly number[]): boolean {
  // a router's gate stays float32, and so do an adapter's factors (they train)
  return shape.length === 2 && !/(block_sparse_moe|mlp)\.gate\.weight$|\.lora_[AB]\.weight$/.test(name);
}

/** The bytes a weight of this name and shape takes held in `format` (null: float32): a matrix compactWeight takes is packed. */
export function weightBytes(name: string, shape: readonly number[], format: WeightFormat | null): number {
  if (format && compactWeight(name, shape)) return formatBytes(format, shape[0], shape[1]);
  return 4 * shape.reduce((a, b) => a * b, 1);
}

/**
 * The bytes a part of the model holds in `format` (null: float32, as partBytes): the part is built empty (its float32
 * buffers are never written, so they never become resident) and counted weight by weight.
 */
export function partHeldBytes(config: ModelConfig, part: ModelPart, format: WeightFormat | null): number {
  if (!format) return partBytes(config, part);
  let bytes = 0;
  for (const [name, t] of createModel(config, { init: false, section: part }).hfStateDict()) bytes += weightBytes(name, t.shape, format);
  return bytes;
}

/** Whether a model path is a GGUF file (llama.cpp's, Ollama's) rather than a Hugging Face directory. */
export function isGGUF(path: string): boolean {
  return path.toLowerCase().endsWith('.gguf');
}

/**
 * loadModel for a GGUF file: its config, tokenizer and tensors under Hugging Face's names (gguf-model.ts). A Q8_0 or
 * Q4_0 tensor loaded as int8 or int4 is taken as it is (the same values); anything else is read in float32 and packed.
 */
async function loadGGUF(path: string, options: LoadOptions): Promise<CausalLM> {
  const file = GGUFModel.open(path);
  try {
    const config = configFromHF(file.config);
    const part = options.part;
    const format = weightFormat(options);
    const model = createModel(config, { init: false, section: part });
    const own = model.hfStateDict();
    const seen = new Set<string>();
    const unexpected: string[] = [];
    noGrad(() => {
      for (const w of file.weights()) {
        const target = own.get(w.name);
        if (target === undefined) {
          if (!part || layersOfWeight(config, w.name).length === 0) unexpected.push(w.name);
          continue;
        }
        if (w.shape.join() !== target.shape.join()) {
          throw new StateDictError(`${path}: '${w.name}' is [${w.shape}], its config implies [${target.shape}]`, { details: { key: w.name } });
        }
        const packed = format && compactWeight(w.name, target.shape) ? file.readPacked(w.name) : null;
        if (packed && packed.format === format) holdPacked(target, packed);
        else if (format && compactWeight(w.name, target.shape)) packWeight(target, format, file.read(w.name).data);
        else target.data.set(file.read(w.name).data);
        seen.add(w.name);
      }
    });
    const missing = [...own.keys()].filter((k) => !seen.has(k));
    if (missing.length > 0 || unexpected.length > 0) {
      throw new StateDictError(`${path} does not hold its model: missing [${missing.slice(0, 4).join(', ')}], unexpected [${unexpected.slice(0, 4).join(', ')}]`, {
        details: { missing, unexpected },
      });
    }
    const tok = file.tokenizer();
    model.tokenizer = tok ? new HFTokenizer(tok.json, tok.config) : null;
    return model;
  } finally {
    file.close();
  }
}

/** The bytes a model's weights take as it holds them: compact matrices at their packed size, the rest in float32. */
export function heldBytes(model: CausalLM): number {
  let bytes = 0;
  for (const [, t] of model.hfStateDict()) bytes += t.packed ? packedBytes(t.packed) : 4 * t.size;
  return bytes;
}

/** The config of a Hugging Face directory (config.json), or of a GGUF file, without its weights. */
export function loadConfig(dir: string): ModelConfig {
  if (isGGUF(dir)) return withGGUF(dir, (file) => configFromHF(file.config));
  return configFromHF(readJson(join(dir, 'config.json'), 'config.json'));
}

function withGGUF<T>(path: string, read: (file: GGUFModel) => T): T {
  const file = GGUFModel.open(path);
  try {
    return read(file);
  } finally {
    file.close();
  }
}

/**
 * The tokenizer of a Hugging Face directory (tokenizer.json, with tokenizer_config.json if present), or of a GGUF file;
 * null if it has none.
 */
export function loadTokenizer(dir: string): HFTokenizer | null {
  if (isGGUF(dir)) return withGGUF(dir, (file) => {
    const tok = file.tokenizer();
    return tok ? new HFTokenizer(tok.json, tok.config) : null;
  });
  const tokPath = join(dir, 'tokenizer.json');
  if (!existsSync(tokPath)) return null;
  const tokConfigPath = join(dir, 'tokenizer_config.json');
  return new HFTokenizer(readJson(tokPath, 'tokenizer.json'), existsSync(tokConfigPath) ? readJson(tokConfigPath, 'tokenizer_config.json') : {});
}

/**
 * The chat template of a Hugging Face directory (tokenizer_config.json's `chat_template`, a
 * Jinja string, or the one named 'default' of a list), or null if it has none.
 */
export function loadChatTemplate(dir: string): string | null {
  const path = join(dir, 'tokenizer_config.json');
  if (!existsSync(path)) return null;
  const t = (readJson(path, 'tokenizer_config.json') as { chat_template?: unknown }).chat_template;
  if (typeof t === 'string') return t;
  if (Array.isArray(t)) {
    const named = t.find((x): x is { name: string; template: string } => typeof x?.template === 'string' && x.name === 'default');
    return named?.template ?? null;
  }
  return null;
}

/**
 * Writes config.json, model.safetensors (sharded with an index above `maxShardBytes`)
 * and tokenizer.json: a directory Hugging Face transformers loads.
 */
export async function saveModel(model: CausalLM, dir: string, options: { maxShardBytes?: number } = {}): Promise<string[]> {
  const files = writeModelFiles(dir, model.config, model.tokenizer);
  // a compact weight is written as the float32 values it stands for (a checkpoint of the model as it computes)
  const weights = new Map([...model.hfStateDict()].map(([k, t]) => [k, t.packed ? new Tensor(unpackMatrix(t.packed), t.shape) : t]));
  return [...files, ...writeCheckpoint(dir, weights, { metadata: { format: 'pt' }, maxShardBytes: options.maxShardBytes })];
}

/**
 * Writes a model to a Hugging Face directory weight by weight, as the weights become available:
 * `weights` lists names and shapes in order, and `read(name)` brings each one when its turn
 * comes, so only that weight is held (the weights of a model split across workers, fetched from
 * them). Sharded above `maxShardBytes`, as saveModel.
 */
export async function saveModelStreamed(
  dir: string,
  config: ModelConfig,
  tokenizer: Tokenizer | null,
  weights: { name: string; shape: number[] }[],
  read: (name: string) => Promise<Tensor>,
  options: { maxShardBytes?: number } = {},
): Promise<string[]> {
  const files = writeModelFiles(dir, config, tokenizer);
  const shards = planShards(weights.map((w) => ({ ...w, dtype: 'F32' as const })), options.maxShardBytes);
  for (const shard of shards) {
    const writer = SafetensorsWriter.create(join(dir, shard.file), shard.tensors, { format: 'pt' });
    try {
      for (const t of shard.tensors) writer.write(t.name, await read(t.name));
      writer.close();
    } finally {
      writer.abandon();
    }
    files.push(shard.file);
  }
  if (shards.length > 1) {
    writeShardIndex(dir, shards);
    files.push(INDEX_FILE);
  }
  return files;
}

/** Everything of a Hugging Face directory but the weights: config.json, generation_config.json and tokenizer.json. */
export function writeModelFiles(dir: string, config: ModelConfig, tokenizer: Tokenizer | null): string[] {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'config.json'), `${JSON.stringify(configToHF(config), null, 2)}\n`);
  const generation = { bos_token_id: config.bosTokenId, eos_token_id: config.eosTokenId };
  writeFileSync(join(dir, 'generation_config.json'), `${JSON.stringify(generation, null, 2)}\n`);
  const out = ['config.json', 'generation_config.json'];
  if (tokenizer) {
    writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tokenizer.toJSON()));
    out.push('tokenizer.json');
    // a tokenizer whose prompts begin with a BOS (a GGUF file's add_bos_token) says so where Hugging Face reads it
    const bos = tokenizer.bosTokenId ?? null;
    if (bos !== null) {
      writeFileSync(join(dir, 'tokenizer_config.json'), `${JSON.stringify({ add_bos_token: true, bos_token: tokenizer.decode([bos]) }, null, 2)}
`);
      out.push('tokenizer_config.json');
    }
  }
  return out;
}
