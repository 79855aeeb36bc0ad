import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';
import { FileNotFoundError, InvalidArgumentError, StateDictError } from '../../errors.ts';
import { Checkpoint } from '../../io/index.ts';
import { emptyPacked, packedToBytes, packRows, type WeightFormat } from '../../tensor/index.ts';
import type { ModelConfig } from '../config.ts';
import { configFromHF, familyOf } from '../families/index.ts';
import { compactWeight, weightBytes } from './hf.ts';
import type { ModelPart } from '../model.ts';

/**
 * A Hugging Face checkpoint directory seen weight by weight, without loading it: the names
 * and shapes of any part of the model, each weight's float32 bytes cut into chunks and read
 * one chunk at a time, and the sha256 of every chunk, computed once and cached. The user
 * streams a worker's section from here; a worker indexes the checkpoints it holds with it.
 * A compact job's matrices travel in their format instead (bf16, int8, int4: packedToBytes of
 * the weight, packed from its float32 rows a few at a time), chunked and hashed the same way.
 */

/**
 * Checkpoint keys that are buffers (attention masks, rotary tables) or duplicates of tied weights (an untied head's
 * name, `headName`), never parameters.
 */
export function ignorableKey(key: string, tied: boolean, headName = 'lm_head.weight'): boolean {
  return /\.(attn|attention)\.(masked_)?bias$/.test(key) || /rotary_emb\.inv_freq$/.test(key) || (tied && (key === 'lm_head.weight' || key === headName));
}

/**
 * The layers a weight belongs to, by its Hugging Face name: 0 the embedding, 1..L the blocks,
 * L + 1 the final norm, L + 2 the head (a token table tied to the head belongs to both ends).
 * Empty for a name the architecture does not have. Where each name sits is its family's layout.
 */
export function layersOfWeight(config: ModelConfig, name: string): number[] {
  const layout = familyOf(config).layout;
  const L = config.layers;
  const tied = config.tieWordEmbeddings;
  if (name === layout.table) return tied ? [0, L + 2] : [0];
  if (layout.embedding?.test(name)) return [0];
  if (name === layout.head) return tied ? [] : [L + 2];
  if (layout.norm.test(name)) return [L + 1];
  if (name.startsWith(`${layout.blocks}.`)) {
    const m = /^(\d+)\./.exec(name.slice(layout.blocks.length + 1));
    if (m && Number(m[1]) < L) return [Number(m[1]) + 1];
  }
  return [];
}

/** The model's name for a checkpoint key: a base model's checkpoint may lack its family's prefix (`transformer.`). */
export function canonicalName(config: ModelConfig, key: string): string {
  if (layersOfWeight(config, key).length > 0) return key;
  const prefix = familyOf(config).layout.basePrefix;
  return prefix !== undefined && layersOfWeight(config, `${prefix}${key}`).length > 0 ? `${prefix}${key}` : key;
}

/** Whether a part of the model holds layer `layer`. */
function partHolds(config: ModelConfig, part: ModelPart, layer: number): boolean {
  if (part === 'ends') return layer === 0 || layer > config.layers;
  return layer >= part[0] && layer < part[1];
}

/** One weight of a part: its name and shape. */
export interface WeightShape {
  name: string;
  shape: number[];
}

/**
 * The weights of a model file that belong to a part of the model, in the file's order. Every layer of the part must
 * have its weights: a part that finds none for one of its layers names it (`where`: the file, for the message).
 */
export function partWeightsOf(config: ModelConfig, weights: WeightShape[], part: ModelPart, where: string): WeightShape[] {
  const out: WeightShape[] = [];
  const covered = new Set<number>();
  for (const w of weights) {
    const layers = layersOfWeight(config, w.name).filter((l) => partHolds(config, part, l));
    if (layers.length === 0) continue;
    for (const l of layers) covered.add(l);
    out.push(w);
  }
  const [start, end] = part === 'ends' ? [0, config.layers + 3] : part;
  for (let l = start; l < end; l++) {
    if (partHolds(config, part, l) && !covered.has(l)) throw new StateDictError(`${where} has no weights for layer ${l}`);
  }
  return out;
}

/**
 * A model file seen weight by weight, as a section is streamed from it to a worker: a Hugging Face checkpoint
 * directory (CheckpointWeights) or a GGUF file (GGUFWeights). A weight travels in float32, or packed in a compact
 * job's format; its bytes are cut into chunks, each addressed by its sha256.
 */
export interface ModelWeights {
  readonly config: ModelConfig;
  partWeights(part: ModelPart): WeightShape[];
  travelFormat(name: string, format: WeightFormat | null): WeightFormat | null;
  /** Bytes of a weight as it travels for a job held in `format` (null: float32). */
  byteLength(name: string, format?: WeightFormat | null): number;
  /** The sha256 of each chunk of a weight as it travels. */
  hashes(name: string, format?: WeightFormat | null): Promise<string[]>;
  /** Chunk `index` of a weight as it travels (`scratch`: room for float32 bytes used at once and not kept). */
  chunk(name: string, index: number, scratch?: Float32Array, format?: WeightFormat | null): Uint8Array;
  close(): void;
}

/** A file's identity for the hash cache: a changed (or replaced) file is hashed again. */
interface FileStamp {
  size: number;
  mtimeMs: number;
  ctimeMs: number;
  ino: number;
}

function sameFile(a: FileStamp, b: FileStamp): boolean {
  return a.size === b.size && a.mtimeMs === b.mtimeMs && a.ctimeMs === b.ctimeMs && a.ino === b.ino;
}

interface HashCache {
  version: 2;
  chunkBytes: number;
  files: Record<string, FileStamp & { hashes: Record<string, string[]> }>;
}

/** Where hashes of checkpoints are cached by default: `$TENSORLINK_CACHE`, else ~/.cache/tensorlink. */
export function defaultCacheDir(): string {
  return process.env.TENSORLINK_CACHE ?? join(homedir(), '.cache', 'tensorlink');
}

/** Float32 values read at a time when a matrix is packed to travel (4 MiB). */
const PACK_ELEMENTS = 1 << 20;

/** Yields to the event loop: long hashing must not starve the sends it overlaps with. */
export const yieldNow = () => new Promise<void>((r) => setImmediate(r));

export class CheckpointWeights implements ModelWeights {
  private cache: HashCache;
  private dirty = false;
  private scratch: Float32Array | null = null;
  /** The packed bytes of the last weights packed (the one sending and the one hashed ahead of it). */
  private packed = new Map<string, Uint8Array>();

  private constructor(
    readonly dir: string,
    readonly config: ModelConfig,
    private readonly ckpt: Checkpoint,
    /** Model name → checkpoint key (a base model's checkpoint may lack its family's prefix). */
    private readonly keys: Map<string, string>,
    private readonly chunkBytes: number,
    private readonly cacheFile: string | null,
  ) {
    this.cache = { version: 2, chunkBytes, files: {} };
    if (cacheFile) {
      try {
        const cached = JSON.parse(readFileSync(cacheFile, 'utf8')) as HashCache;
        if (cached.version === 2 && cached.chunkBytes === chunkBytes && typeof cached.files === 'object') this.cache = cached;
      } catch {
        // no cache yet, or an unreadable one: hash again
      }
    }
  }

  /**
   * Opens a checkpoint directory (config.json and safetensors files). `chunkBytes` is the size
   * of the float32 chunks that are hashed; `cacheDir` (null: no cache) keeps their hashes.
   */
  static open(dir: string, options: { chunkBytes: number; cacheDir?: string | null }): CheckpointWeights {
    let raw: unknown;
    try {
      raw = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
    } catch (cause) {
      throw new FileNotFoundError(`${dir} holds no readable config.json`, { cause });
    }
    if (typeof raw !== 'object' || raw === null) throw new InvalidArgumentError(`${join(dir, 'config.json')} is not a JSON object`);
    const config = configFromHF(raw as Record<string, unknown>);
    const ckpt = Checkpoint.open(dir);
    const keys = new Map<string, string>();
    for (const key of ckpt.keys()) {
      if (ignorableKey(key, config.tieWordEmbeddings, familyOf(config).layout.head)) continue;
      keys.set(canonicalName(config, key), key);
    }
    const cacheDir = options.cacheDir === undefined ? defaultCacheDir() : options.cacheDir;
    const cacheFile = cacheDir ? join(cacheDir, `${createHash('sha256').update(resolve(dir)).digest('hex').slice(0, 32)}.json`) : null;
    return new CheckpointWeights(dir, config, ckpt, keys, options.chunkBytes, cacheFile);
  }

  /** Every weight of the model, by its model name. */
  names(): string[] {
    return [...this.keys.keys()];
  }

  has(name: string): boolean {
    return this.keys.has(name);
  }

  private key(name: string): string {
    const key = this.keys.get(name);
    if (key === undefined) throw new StateDictError(`the checkpoint in ${this.dir} has no weight '${name}'`, { details: { key: name } });
    return key;
  }

  shape(name: string): number[] {
    return this.ckpt.info(this.key(name)).shape;
  }

  travelFormat(name: string, format: WeightFormat | null): WeightFormat | null {
    return format && compactWeight(name, this.shape(name)) ? format : null;
  }

  /** Bytes of a weight as it travels for a job held in `format` (null: float32). */
  byteLength(name: string, format: WeightFormat | null = null): number {
    return weightBytes(name, this.shape(name), format);
  }

  /**
   * The weights of a part of the model, in checkpoint order. Every layer of the part must have
   * its weights: a part that finds none for one of its layers names it.
   */
  partWeights(part: ModelPart): WeightShape[] {
    return partWeightsOf(this.config, [...this.keys.keys()].map((name) => ({ name, shape: this.shape(name) })), part, `the checkpoint in ${this.dir}`);
  }

  /** Chunks of a weight as it travels (an empty weight is one empty chunk). */
  chunkCount(name: string, format: WeightFormat | null = null): number {
    return Math.max(1, Math.ceil(this.byteLength(name, format) / this.chunkBytes));
  }

  /**
   * Chunk `index` of a weight's bytes as it travels for a job held in `format`: float32 (little-endian) read from its
   * file now into a new array, or into `scratch` (for bytes used at once and not kept, as when hashing); a compact
   * matrix's packed bytes, a view of the packed weight.
   */
  chunk(name: string, index: number, scratch?: Float32Array, format: WeightFormat | null = null): Uint8Array {
    const travel = this.travelFormat(name, format);
    if (travel) {
      const bytes = this.packedWeight(name, travel);
      return bytes.subarray(index * this.chunkBytes, Math.min(bytes.byteLength, (index + 1) * this.chunkBytes));
    }
    const per = this.chunkBytes / 4;
    const total = this.byteLength(name) / 4;
    const start = index * per;
    const data = this.ckpt.readFloat32(this.key(name), start, Math.max(0, Math.min(per, total - start)), scratch);
    return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  }

  /** A matrix's packed bytes in `format`, packed from its float32 rows PACK_ROWS at a time (the last two are kept). */
  private packedWeight(name: string, format: WeightFormat): Uint8Array {
    const id = `${name}@${format}`;
    const kept = this.packed.get(id);
    if (kept) return kept;
    const [rows, cols] = this.shape(name);
    const p = emptyPacked(rows, cols, format);
    const per = Math.max(1, Math.floor(PACK_ELEMENTS / Math.max(1, cols)));
    const scratch = new Float32Array(per * cols);
    for (let r = 0; r < rows; r += per) {
      const n = Math.min(per, rows - r);
      packRows(p, r, this.ckpt.readFloat32(this.key(name), r * cols, n * cols, scratch));
    }
    const bytes = packedToBytes(p);
    if (this.packed.size >= 2) this.packed.delete(this.packed.keys().next().value!);
    this.packed.set(id, bytes);
    return bytes;
  }

  private stamp(name: string): { file: string } & FileStamp {
    const file = this.ckpt.fileOf(this.key(name));
    const st = statSync(join(this.dir, file));
    return { file, size: st.size, mtimeMs: st.mtimeMs, ctimeMs: st.ctimeMs, ino: st.ino };
  }

  /** Whether the hashes of a weight are cached (its file unchanged since). */
  cached(name: string): boolean {
    const { file, ...stamp } = this.stamp(name);
    const entry = this.cache.files[file];
    return entry !== undefined && sameFile(entry, stamp) && entry.hashes[this.key(name)] !== undefined;
  }

  /**
   * The sha256 of each chunk of a weight as it travels for a job held in `format` (null: float32): from the cache, or
   * read and hashed now (yielding between chunks).
   */
  async hashes(name: string, format: WeightFormat | null = null): Promise<string[]> {
    const { file, ...stamp } = this.stamp(name);
    let entry = this.cache.files[file];
    if (!entry || !sameFile(entry, stamp)) {
      entry = { ...stamp, hashes: {} };
      this.cache.files[file] = entry;
    }
    const travel = this.travelFormat(name, format);
    const key = travel ? `${this.key(name)}@${travel}` : this.key(name);
    const known = entry.hashes[key];
    if (known) return known;
    const out: string[] = [];
    // one scratch buffer for every chunk hashed: hashing a large checkpoint leaves no garbage behind
    this.scratch ??= new Float32Array(this.chunkBytes / 4);
    for (let i = 0; i < this.chunkCount(name, travel); i++) {
      out.push(createHash('sha256').update(this.chunk(name, i, this.scratch, travel)).digest('hex'));
      await yieldNow();
    }
    entry.hashes[key] = out;
    this.dirty = true;
    return out;
  }

  /** Writes new hashes to the cache file (a cache that cannot be written is only slower next time). */
  saveCache(): void {
    if (!this.cacheFile || !this.dirty) return;
    try {
      mkdirSync(join(this.cacheFile, '..'), { recursive: true });
      const tmp = `${this.cacheFile}.${process.pid}.tmp`;
      writeFileSync(tmp, JSON.stringify(this.cache));
      renameSync(tmp, this.cacheFile);
      this.dirty = false;
    } catch {
      // read-only home or cache directory: hashes are computed again next time
    }
  }

  close(): void {
    this.saveCache();
    this.ckpt.close();
  }
}
