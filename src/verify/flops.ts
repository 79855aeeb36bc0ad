import { configFromHF, type ModelConfig, modelLayers } from '../models/index.ts';
import type { RecordKind } from './records/index.ts';

/** What a section's computations cost: forward FLOPs per token and the parameters it holds. */
export interface SectionCost {
  flopsPerToken: number;
  params: number;
}

/**
 * FLOPs an optimizer step takes per parameter: AdamW reads and writes two moments and the
 * weight, about a dozen multiply-adds, divisions and square roots per parameter.
 */
export const STEP_FLOPS_PER_PARAM = 12;

/** The cost of layers [start, end) of a model (global layer indices, the records' `stage`), from the layer profiles. */
export function sectionCost(config: ModelConfig | Record<string, unknown>, range: readonly [number, number]): SectionCost {
  const c = 'arch' in config && typeof config.arch === 'string' && 'hidden' in config ? (config as ModelConfig) : configFromHF(config as Parameters<typeof configFromHF>[0]);
  let flopsPerToken = 0;
  let params = 0;
  for (const l of modelLayers(c).slice(range[0], range[1])) {
    const p = l.profile();
    flopsPerToken += p.flopsPerToken;
    params += p.params;
  }
  return { flopsPerToken, params };
}

/**
 * The FLOPs a record states (and the ledger pays for): a forward or decoding step costs
 * the section's forward FLOPs per token times the tokens it was given, a backward twice
 * that (gradients of inputs and of weights), an optimizer step STEP_FLOPS_PER_PARAM per
 * parameter. A re-execution checks it against the tokens the worker kept.
 */
export function recordFlops(kind: RecordKind, cost: SectionCost, tokens: number): number {
  if (kind === 'step') return STEP_FLOPS_PER_PARAM * cost.params;
  return (kind === 'backward' ? 2 : 1) * cost.flopsPerToken * tokens;
}
