import { type Embedding, Module } from '../nn/index.ts';
import { Generator, linear, type Tensor, ZeroGenerator } from '../tensor/index.ts';
import type { ModelConfig } from './config.ts';
import { runLayers } from './forward.ts';
import {
  type CausalLM, type ForwardContext, type ForwardOptions, type LayerProfile, layerProfile, type ModelLayer, type ModelPart, partLayers,
  type SectionParts, sectionParts,
} from './model.ts';
import type { Tokenizer } from './tokenizer.ts';

/**
 * Every family's layer list has one shape: an embedding, the blocks, a final norm and a head, as its model holds them
 * (or would: a section lists all of them, building only its own). A family says what differs — its names, its
 * embedding (learned positions, a scale, a layer norm), its block's profile, its norm's size, and what follows the
 * head's product (a soft-cap) — and decoderLayers lists them.
 */
export interface DecoderLayout {
  blocks: number;
  hidden: number;
  vocab: number;
  /** The embedding layer without its kind (see plainEmbedding). */
  embedding: Pick<ModelLayer, 'name' | 'namedParameters' | 'forward' | 'profile'>;
  /** The blocks' names are `${blockPrefix}.${i}` ('model.layers', 'transformer.h'). */
  blockPrefix: string;
  block: (i: number) => Module & { forward(x: Tensor, ctx: ForwardContext, blockIndex: number): Tensor };
  blockProfile: (i: number) => LayerProfile;
  /** The final norm: its name, module, and parameter count (hidden for an RMSNorm, twice that for a LayerNorm). */
  norm: { name: string; module: () => Module & { forward(x: Tensor): Tensor }; params: number };
  /** The head: its layer's name, its weight's checkpoint name (the embedding's when tied), and the weight. */
  head: { name: string; weightName: string; weight: () => Tensor; after?: (logits: Tensor) => Tensor };
}

export function decoderLayers(d: DecoderLayout): ModelLayer[] {
  const { hidden: h, vocab: v, norm, head } = d;
  return [
    { ...d.embedding, kind: 'embedding', blockIndex: -1 },
    ...Array.from({ length: d.blocks }, (_, i): ModelLayer => ({
      name: `${d.blockPrefix}.${i}`,
      kind: 'block',
      blockIndex: i,
      namedParameters: () => [...d.block(i).namedParameters(`${d.blockPrefix}.${i}`)],
      forward: (x, ctx) => d.block(i).forward(x, ctx, i),
      profile: () => d.blockProfile(i),
    })),
    {
      name: norm.name,
      kind: 'norm',
      blockIndex: -1,
      namedParameters: () => [...norm.module().namedParameters(norm.name)],
      forward: (x) => norm.module().forward(x),
      profile: () => layerProfile(norm.params, 4 * norm.params, h),
    },
    {
      name: head.name,
      kind: 'head',
      blockIndex: -1,
      namedParameters: () => [[head.weightName, head.weight()]],
      forward: (x) => (head.after ? head.after(linear(x, head.weight())) : linear(x, head.weight())),
      profile: () => layerProfile(v * h, 2 * v * h, v),
    },
  ];
}

/** An embedding that is a table lookup and nothing else, named `name` (its weight `${name}.weight`). */
export function plainEmbedding(name: string, table: () => Embedding, vocab: number, hidden: number): DecoderLayout['embedding'] {
  return {
    name,
    namedParameters: () => [[`${name}.weight`, table().weight]],
    forward: (ids) => table().forward(ids),
    profile: () => layerProfile(vocab * hidden, 0, hidden),
  };
}

/**
 * What every family's constructor starts from: the parts of the model this object builds, its section (the whole
 * model by default), and where its weights come from (seeded, or nothing to draw for a section or a model to be loaded).
 */
export function sectionSetup(
  layers: number, tied: boolean, options: { seed?: number; init?: boolean; section?: ModelPart },
): { parts: SectionParts; section: ModelPart; rng: Generator } {
  return {
    parts: sectionParts(layers, options.section, tied),
    section: options.section ?? [0, layers + 3],
    rng: options.init === false || options.section ? new ZeroGenerator() : new Generator(options.seed ?? 0),
  };
}

/**
 * What every family's model is besides its modules: the layers it holds (of the whole list, its section's), a forward
 * that folds them, and its state dict under the checkpoint's names. A family builds its modules, sets its section, and
 * hands its layer list to setLayers.
 */
export abstract class DecoderLM extends Module implements CausalLM {
  abstract readonly config: ModelConfig;
  section: ModelPart = 'ends';
  layers: readonly ModelLayer[] = [];
  wholeLayers: readonly ModelLayer[] = [];
  tokenizer: Tokenizer | null = null;

  /** Every layer of the whole model, of which this object holds its section's. */
  protected setLayers(whole: readonly ModelLayer[]): void {
    this.wholeLayers = whole;
    this.layers = partLayers(whole, this.section);
  }

  forward(ids: Tensor, options: ForwardOptions = {}): Tensor {
    return runLayers(this.layers, ids, options, this.config.maxPositions);
  }

  hfStateDict(): Map<string, Tensor> {
    return new Map(this.namedParameters());
  }
}
