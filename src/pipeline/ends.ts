import { type CausalLM, createModel, layerParameters, type SectionRange } from '../models/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { type ExecutorOptions, StageExecutor, TiedParameters } from './executor.ts';
import { LocalStage } from './local-stage.ts';
import type { PipelineStage } from './trainer.ts';

/**
 * The user's ends of a model it keeps at home: the embedding (first stage) and the final
 * norm with the head (last stage), run on the model's own layers, so training updates the
 * user's model in place. A head tied to the embedding is one tensor, stepped once by the first.
 */
export function userEnds(model: CausalLM, options: ExecutorOptions): { first: PipelineStage; last: PipelineStage } {
  const layers = model.layers;
  const max = model.config.maxPositions;
  const headLayers = layers.slice(layers.length - 2);
  const embedParams = new Set(layerParameters(layers.slice(0, 1)).values());
  const shared = new Set([...layerParameters(headLayers).values()].filter((p) => embedParams.has(p)));
  const ties = new TiedParameters(shared);
  const embed = new StageExecutor(layers.slice(0, 1), max, { ...options, tied: { ties, role: 'owner' } });
  const head = new StageExecutor(headLayers, max, { ...options, tied: { ties, role: 'user' } });
  return {
    first: { replicas: [new LocalStage(embed)], order: 'forwards-first' },
    last: { replicas: [new LocalStage(head)], order: 'one-by-one' },
  };
}

/** The weights of layers [start, end) of a whole model, under their checkpoint names (shared, not copied). */
export function sectionWeights(model: CausalLM, range: SectionRange): Map<string, Tensor> {
  const state = model.hfStateDict();
  const names = [...createModel(model.config, { section: range }).hfStateDict().keys()];
  return new Map(names.map((k) => [k, state.get(k)!]));
}

/** A separate model holding a copy of layers [start, end) of `model`. */
export function sectionCopy(model: CausalLM, range: SectionRange): CausalLM {
  const part = createModel(model.config, { section: range });
  part.loadStateDict(sectionWeights(model, range));
  return part;
}

/**
 * A whole pipeline in this process over the in-memory transport (tests, benchmarks): the
 * user's ends on `model` itself (with privacy 'ends'), and `replicas` copies of each section
 * in `cuts` (global layer ranges) as stages of their own; `localSteps`: the replicas keep the
 * weights they start from, for a trainer with `syncEvery` > 1.
 */
export function localPipeline(
  model: CausalLM,
  cuts: SectionRange[],
  options: ExecutorOptions & { replicas?: number; privacy?: 'ends' | 'none'; localSteps?: boolean },
): PipelineStage[] {
  const replicas = options.replicas ?? 1;
  const middle = cuts.map((range): PipelineStage => ({
    replicas: Array.from({ length: replicas }, (_, j) => {
      const part = sectionCopy(model, range);
      const executor = new StageExecutor(part.layers, model.config.maxPositions, options);
      return new LocalStage(executor, `section [${range}) replica ${j}`, null, options.localSteps === true && replicas > 1);
    }),
  }));
  if ((options.privacy ?? 'ends') === 'none') return middle;
  const ends = userEnds(model, options);
  return [ends.first, ...middle, ends.last];
}
