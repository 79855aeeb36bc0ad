import { InvalidArgumentError } from '../errors.ts';
import {
  type CausalLM, CheckpointWeights, GGUFWeights, heldBytes, isGGUF, loadModel, loadTokenizer, type ModelConfig, type ModelLayer,
  type LoraConfig, modelLayers, type ModelWeights, partBytes, partHeldBytes, type SectionRange, type Tokenizer,
} from '../models/index.ts';
import { CHUNK_BYTES, type WireAdapter } from '../p2p/index.ts';
import { sectionWeights } from '../pipeline/index.ts';
import type { Tensor, WeightFormat } from '../tensor/index.ts';
import { checkpointSource, type SectionSource, tensorSource } from './section-source.ts';

/**
 * What the user holds of a model it distributes: its config and tokenizer, the layers it runs
 * itself (its ends, or a whole model it already has in memory), and where each worker's section
 * comes from. A model given as a checkpoint directory is never loaded whole: the user builds its
 * ends alone (none with privacy 'none') and streams sections from the files.
 */
export interface UserModel {
  readonly config: ModelConfig;
  readonly tokenizer: Tokenizer | null;
  /** The layers the user runs (its first and last two positions are the ends); null when it keeps none. */
  readonly ends: CausalLM | null;
  /** The whole model, when the user holds it in memory. */
  readonly whole: CausalLM | null;
  /** Every layer of the model (names and profiles), for planning. */
  readonly layers: readonly ModelLayer[];
  /** Bytes of the weights the user holds. */
  readonly heldBytes: number;
  /** Where layers [start, end) come from when a worker loads them. */
  section(range: SectionRange): SectionSource;
  /** The files the model came from, if it came from a directory (tokenizer and generation config are copied from there on save). */
  readonly dir: string | null;
  /** The compact format the job's matrices are held in, by the user's ends and by every worker's section (null: float32). */
  readonly format: WeightFormat | null;
  /** The job's LoRA adapter (withAdapter): on the user's ends and every section, the base frozen; null: none. */
  readonly adapter?: JobAdapter | null;
  close(): void;
}

/** A model the user already holds in memory. */
export function modelInMemory(model: CausalLM): UserModel {
  if ([...model.hfStateDict()].some(([, t]) => t.packed)) {
    throw new InvalidArgumentError('a model held compact is distributed from its checkpoint directory: distribute(dir, { quantize | dtype })');
  }
  // a section's names come from building it empty: once per range, not on every load, save or pull
  // (its hashes are not kept: the weights may have changed since)
  const sections = new Map<string, Map<string, Tensor>>();
  return {
    config: model.config,
    tokenizer: model.tokenizer,
    ends: model,
    whole: model,
    layers: model.wholeLayers,
    heldBytes: 4 * model.numParameters(),
    section: (range) => {
      const key = `${range[0]}:${range[1]}`;
      if (!sections.has(key)) sections.set(key, sectionWeights(model, range));
      return tensorSource(sections.get(key)!);
    },
    dir: null,
    format: null,
    close: () => {},
  };
}

/**
 * A model in a Hugging Face directory or a GGUF file, of which the user loads only its ends (`keepEnds`) and
 * the tokenizer; sections stream from the checkpoint. The chunk hashes are cached in `cacheDir`
 * (default: defaultCacheDir(); null: none), so a second run sends its manifests without hashing.
 */
export async function modelFromCheckpoint(
  dir: string, options: { keepEnds: boolean; cacheDir?: string | null; format?: WeightFormat | null },
): Promise<UserModel> {
  const checkpoint: ModelWeights = isGGUF(dir)
    ? GGUFWeights.open(dir, { chunkBytes: CHUNK_BYTES })
    : CheckpointWeights.open(dir, { chunkBytes: CHUNK_BYTES, cacheDir: options.cacheDir });
  try {
    const config = checkpoint.config;
    const format = options.format ?? null;
    const compact = format === null ? {} : format === 'bf16' ? { dtype: 'bf16' as const } : { quantize: format };
    const ends = options.keepEnds ? await loadModel(dir, { part: 'ends', ...compact }) : null;
    const tokenizer = ends?.tokenizer ?? loadTokenizer(dir);
    return {
      config,
      tokenizer,
      ends,
      whole: null,
      layers: format ? heldLayers(config, format) : modelLayers(config),
      heldBytes: ends ? (format ? heldBytes(ends) : partBytes(config, 'ends')) : 0,
      section: (range) => checkpointSource(checkpoint, range, format),
      dir,
      format,
      close: () => checkpoint.close(),
    };
  } catch (err) {
    checkpoint.close();
    throw err;
  }
}

/**
 * The model's layers for planning a job held in `format`: each layer's bytes are what a worker holds of it (its
 * matrices packed), not float32, so that the plan fits sections by the bytes they take.
 */
function heldLayers(config: ModelConfig, format: WeightFormat): readonly ModelLayer[] {
  return modelLayers(config).map((layer, i) => {
    const bytes = partHeldBytes(config, [i, i + 1], format);
    const profile = { ...layer.profile(), bytes };
    return {
      name: layer.name, kind: layer.kind, blockIndex: layer.blockIndex,
      namedParameters: () => layer.namedParameters(), forward: (x, ctx) => layer.forward(x, ctx), profile: () => profile,
    };
  });
}

/** A job's adapter as the user holds it: its config, where its first factors come from, and how a load names it. */
export interface JobAdapter {
  config: LoraConfig & { targets: string[] };
  /** The PEFT folder the factors are read from; null: new factors drawn from `seed`. */
  dir: string | null;
  seed: number;
  wire: WireAdapter;
  /** The hash of a hosted model whose blocks the job's sections share (only the factors are loaded); absent: private copies. */
  base?: string;
}
