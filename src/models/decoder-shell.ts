import { Embedding, LayerNorm, type Linear, Module, ModuleList } from '../nn/index.ts';
import type { Generator, Tensor } from '../tensor/index.ts';
import type { DecoderConfigBase, ModelConfig } from './config.ts';
import { normalInit, proj } from './decoder-parts.ts';
import { DecoderLM, decoderLayers, type DecoderLayout, plainEmbedding, sectionSetup } from './decoder-layers.ts';
import { type ForwardContext, type LayerProfile, layerProfile, type ModelLayer, type ModelPart, type SectionParts } from './model.ts';

/** A block as the shell runs it: its checkpoint names are its own, its forward adds to the residual stream. */
export type ShellBlock = Module & { forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor };

/**
 * The checkpoint's names of a LayerNorm decoder's modules: the inner model (`prefix`) holds the token table,
 * the blocks and the final norm; the untied head sits beside it.
 */
export interface ShellNames {
  /** The inner model ('transformer', 'gpt_neox'). */
  prefix: string;
  /** The token table inside it ('word_embeddings', 'embed_in'). */
  table: string;
  /** A LayerNorm right after the table, part of the embedding layer (BLOOM's 'word_embeddings_layernorm'). */
  tableNorm?: string;
  /** The list of blocks inside it ('h', 'layers'). */
  blocks: string;
  /** The final LayerNorm inside it ('ln_f', 'final_layer_norm'). */
  norm: string;
  /** The untied head beside it ('lm_head', 'embed_out'). */
  head: string;
}

/** What a family gives the shell: its names, its checks, its block and that block's profile. */
export interface ShellSpec<C extends ModelConfig, B extends ShellBlock> {
  names: ShellNames;
  validate(config: C): void;
  block(config: C, rng: Generator): B;
  blockProfile(config: C): LayerProfile;
}

/**
 * The inner model: the token table (and its norm), the blocks and the final norm, registered in that order under the
 * checkpoint's names; a section builds only its own.
 */
export class ShellBody<B extends ShellBlock> extends Module {
  readonly table: Embedding | null;
  readonly tableNorm: LayerNorm | null;
  readonly blocks: ModuleList<B>;
  readonly norm: LayerNorm | null;
  constructor(c: DecoderConfigBase, names: ShellNames, block: (rng: Generator) => B, rng: Generator, parts: SectionParts) {
    super();
    this.table = parts.tokenTable ? this.addModule(names.table, new Embedding(c.vocabSize, c.hidden, { rng })) : null;
    if (this.table) normalInit(this.table, c.initializerRange, rng);
    this.tableNorm = names.tableNorm && parts.embedding ? this.addModule(names.tableNorm, new LayerNorm(c.hidden, c.normEps)) : null;
    const [first, last] = parts.blocks;
    this.blocks = this.addModule(names.blocks, new ModuleList(Array.from({ length: last - first }, () => block(rng)), first));
    this.norm = parts.norm ? this.addModule(names.norm, new LayerNorm(c.hidden, c.normEps)) : null;
  }
}

/**
 * A LayerNorm decoder (GPT-NeoX, Falcon, BLOOM) but for its block: the inner model under `names.prefix`, the untied
 * head under `names.head`, and its layer list. A family subclasses it with its spec and keeps only what differs.
 *
 * @example
 * class Falcon extends ShellLM<FalconConfig, FalconDecoderLayer> {
 *   constructor(config: FalconConfig, options: ShellOptions = {}) {
 *     super(config, options, FALCON_SHELL);
 *   }
 * }
 */
export abstract class ShellLM<C extends ModelConfig, B extends ShellBlock> extends DecoderLM {
  readonly config: C;
  /** The inner model, registered as `names.prefix` (Falcon's `transformer`, GPT-NeoX's `gpt_neox`). */
  readonly body: ShellBody<B>;
  /** The untied head, registered as `names.head` (`lm_head`, `embed_out`), when this part holds it. */
  readonly head: Linear | null;

  /** @param options.section build only layers [start, end), uninitialised (see sectionSetup). */
  constructor(config: C, options: ShellOptions, spec: ShellSpec<C, B>) {
    super();
    spec.validate(config);
    this.config = config;
    const { names } = spec;
    const { parts, section, rng } = sectionSetup(config.layers, config.tieWordEmbeddings, options);
    this.section = section;
    this.body = this.addModule(names.prefix, new ShellBody(config, names, (r) => spec.block(config, r), rng, parts));
    const untied = !config.tieWordEmbeddings && parts.head;
    this.head = untied ? this.addModule(names.head, proj(config.hidden, config.vocabSize, false, config, rng)) : null;
    this.setLayers(shellLayers(config, names, this.body, () => this.head, spec.blockProfile(config)));
  }
}

/** How a family's model is built: seeded, not drawn (init false, to be loaded), or one section of it. */
export interface ShellOptions {
  seed?: number;
  init?: boolean;
  section?: ModelPart;
}

/** The layer list of a shell model: its embedding (and the table's norm), blocks, final norm and head. */
function shellLayers<B extends ShellBlock>(
  c: DecoderConfigBase, names: ShellNames, m: ShellBody<B>, head: () => Linear | null, profile: LayerProfile,
): ModelLayer[] {
  const h = c.hidden;
  const p = names.prefix;
  const tableName = `${p}.${names.table}`;
  const tableNorm = names.tableNorm;
  const embedding: DecoderLayout['embedding'] = tableNorm
    ? {
        name: tableName,
        namedParameters: () => [
          [`${tableName}.weight`, m.table!.weight],
          ...m.tableNorm!.namedParameters(`${p}.${tableNorm}`),
        ],
        forward: (ids) => m.tableNorm!.forward(m.table!.forward(ids)),
        profile: () => layerProfile(c.vocabSize * h + 2 * h, 8 * h, h),
      }
    : plainEmbedding(tableName, () => m.table!, c.vocabSize, h);
  return decoderLayers({
    blocks: c.layers, hidden: h, vocab: c.vocabSize,
    embedding,
    blockPrefix: `${p}.${names.blocks}`,
    block: (b) => m.blocks.byIndex(b),
    // a block's profile, counted from its checkpoint names (a section may hold no block to count)
    blockProfile: () => ({ ...profile }),
    norm: { name: `${p}.${names.norm}`, module: () => m.norm!, params: 2 * h },
    head: {
      name: names.head,
      weightName: c.tieWordEmbeddings ? `${tableName}.weight` : `${names.head}.weight`,
      weight: () => head()?.weight ?? m.table!.weight,
    },
  });
}
