import { InvalidArgumentError } from '../../errors.ts';
import type { ModelConfig } from '../config.ts';
import type { ShellNames } from '../decoder-shell.ts';
import { type CausalLM, type LayerProfile, layerProfile, type ModelPart } from '../model.ts';

/**
 * What a model family is to the rest of the project: one record per Hugging Face model_type, in its own file beside
 * the model it builds, listed once in the registry (families/index.ts). Config dispatch, loading, GGUF, `init-model
 * --arch`, the planner's profiles and the CLI's help all read the registry, so adding a family is its file and one
 * line there (and a fixture under test/fixtures/hf/, which test/models/families.test.ts asks of every family).
 */

export type Json = Record<string, unknown>;

/** How a model is built: seeded random weights, or empty to be loaded; the whole model or a section of it. */
export interface BuildOptions {
  seed?: number;
  init?: boolean;
  section?: ModelPart;
}

/** The shape `tensorlink init-model` asks of a family (its flags, with their defaults filled in). */
export interface SmallShape {
  vocabSize: number;
  hidden: number;
  heads: number;
  layers: number;
  maxPositions: number;
  bosTokenId: number;
  eosTokenId: number;
  /** --kv-heads (heads unless given). */
  kvHeads: number;
  /** --intermediate, when given (each family has its own default width). */
  intermediate?: number;
  /** --sliding-window, when given. */
  slidingWindow?: number;
}

/** One weight of a checkpoint: its name and shape. */
export type NamedShape = [name: string, shape: number[]];

/**
 * Where a family's weights sit in its checkpoint, by name: which layer each belongs to (0 the embedding, 1..L the
 * blocks, L + 1 the final norm, L + 2 the head), as checkpoints/checkpoint-weights.ts's layersOfWeight reads it.
 */
export interface CheckpointLayout {
  /** The token table (the head's weight too when tied). */
  table: string;
  /** The embedding layer's other weights (learned positions, a layer norm). */
  embedding?: RegExp;
  /** Blocks are named `${blocks}.${i}.…`. */
  blocks: string;
  /** The final norm's weights. */
  norm: RegExp;
  /** The untied head's weight. */
  head: string;
  /** The prefix a base model's checkpoint leaves off its names (`transformer.`), if any. */
  basePrefix?: string;
}

/**
 * Where a shell model's weights sit (decoder-shell.ts), from the names it registers them under.
 *
 * @example
 * shellLayout({ prefix: 'transformer', table: 'word_embeddings', blocks: 'h', norm: 'ln_f', head: 'lm_head' }).norm;
 * // /^transformer\.ln_f\.(weight|bias)$/
 */
export function shellLayout(n: ShellNames): CheckpointLayout {
  const p = n.prefix;
  return {
    table: `${p}.${n.table}.weight`,
    ...(n.tableNorm ? { embedding: new RegExp(`^${p}\\.${n.tableNorm}\\.(weight|bias)$`) } : {}),
    blocks: `${p}.${n.blocks}`,
    norm: new RegExp(`^${p}\\.${n.norm}\\.(weight|bias)$`),
    head: `${n.head}.weight`,
    basePrefix: `${p}.`,
  };
}

/** The GGUF side of a family (llama.cpp's architecture): only the families that are read from or written to GGUF. */
export interface GGUFArch {
  /** general.architecture. */
  arch: string;
  /** Whether llama.cpp's converter permutes the q/k rows of this architecture (rope type NORM). */
  permuted: boolean;
  /** Whether a GGUF file of this architecture is read back as this family (several families may write one arch). */
  reads: boolean;
  /** Whether its q/k/v biases are always there (not config.json's attention_bias, which a bias in the file would set). */
  qkvBiasBuiltIn?: boolean;
}

/**
 * A family: its config's reading, writing and checks, its model, its checkpoint names with their shapes, its small
 * shape for `init-model`, and its fixtures. Methods (not function-typed fields) so that a record of one config type
 * is a Family of the union.
 */
export interface Family<C extends ModelConfig = ModelConfig> {
  /** The Hugging Face model_type, also the `init-model --arch` value. */
  readonly name: string;
  /** transformers' class (config.json's `architectures`). */
  readonly architecture: string;
  /** Folders under test/fixtures/hf/ holding transformers' outputs for this family. */
  readonly fixtures: readonly string[];
  /** Where its weights sit in a checkpoint. */
  readonly layout: CheckpointLayout;
  /** GGUF, for the families llama.cpp's files carry here. */
  readonly gguf?: GGUFArch;
  /** Whether a config (already read) is this family's. */
  owns(c: ModelConfig): boolean;
  /** config.json as this family's config, not yet validated (InvalidArgumentError naming a field it cannot take). */
  fromHF(raw: Json): C;
  /** The config.json transformers reads back into the same model. */
  toHF(c: C): Json;
  /** The checks beyond the sizes every config has (CONFIG_LIMITS): InvalidArgumentError naming the field. */
  validate(c: C): void;
  /** The model: seeded random weights, or empty to be loaded; the whole model or a section. */
  create(c: C, options: BuildOptions): CausalLM;
  /** The checkpoint names and shapes of block `i`, after its prefix (`attn.c_attn.weight`): what its parameters count. */
  blockWeights(c: C, i: number): NamedShape[];
  /** Block `i`'s profile for the planner (parameters from blockWeights, FLOPs, bytes, KV bytes per token): no weights built. */
  blockProfile(c: C, i: number): LayerProfile;
  /** A new small model's config at `init-model`'s shape (InvalidArgumentError for a flag the family has no use for). */
  small(s: SmallShape): C;
}

/** Parameters of a list of weights. */
export function countParameters(weights: readonly NamedShape[]): number {
  let n = 0;
  for (const [, shape] of weights) n += shape.reduce((a, b) => a * b, 1);
  return n;
}

/**
 * A dense block's profile from its weights: each parameter in one multiply-add per token (2 FLOPs), attention over the
 * context at 4 FLOPs per query dim per context token (scores and weighted sum), keys and values `kvWidth` wide each.
 */
export function denseBlockProfile(weights: readonly NamedShape[], hidden: number, queryWidth: number, kvWidth: number): LayerProfile {
  const params = countParameters(weights);
  return layerProfile(params, 2 * params, hidden, 4 * queryWidth, 2 * kvWidth);
}

/** A Linear's weights (stored [out, in]) and its bias when it has one. */
export function linearWeights(name: string, inF: number, outF: number, bias: boolean): NamedShape[] {
  return bias ? [[`${name}.weight`, [outF, inF]], [`${name}.bias`, [outF]]] : [[`${name}.weight`, [outF, inF]]];
}

/** A LayerNorm's weight and bias. */
export function layerNormWeights(name: string, size: number): NamedShape[] {
  return [[`${name}.weight`, [size]], [`${name}.bias`, [size]]];
}

/** The sizes of every init-model shape, without the flags only some families take. */
export function smallBase(s: SmallShape): Pick<SmallShape, 'vocabSize' | 'hidden' | 'heads' | 'layers' | 'maxPositions' | 'bosTokenId' | 'eosTokenId'> {
  const { vocabSize, hidden, heads, layers, maxPositions, bosTokenId, eosTokenId } = s;
  return { vocabSize, hidden, heads, layers, maxPositions, bosTokenId, eosTokenId };
}

/** init-model's refusal of --sliding-window for a family without a window to set. */
export function noWindow(s: SmallShape, name: string): void {
  if (s.slidingWindow !== undefined) throw new InvalidArgumentError(`--sliding-window is not part of --arch ${name}`);
}

/** init-model's refusal of --kv-heads for a family whose heads each have their keys and values. */
export function multiHead(s: SmallShape): void {
  if (s.kvHeads !== s.heads) throw new InvalidArgumentError(`--kv-heads is not part of this --arch (its ${s.heads} heads each have their keys and values)`);
}
