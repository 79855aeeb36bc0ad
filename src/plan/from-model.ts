import type { ModelLayer } from '../models/index.ts';
import type { LayerCost } from './types.ts';

/** The planner's view of a model: one cost per named layer, from the layer profiles. */
export function layerCosts(layers: readonly ModelLayer[]): LayerCost[] {
  return layers.map((l) => {
    const p = l.profile();
    return {
      name: l.name,
      params: p.params,
      bytes: p.bytes,
      flopsPerToken: p.flopsPerToken,
      activationBytesPerToken: p.activationBytesPerToken,
    };
  });
}
