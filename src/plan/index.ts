export type { Device, LayerCost, Links, Plan, Stage, StrategyName } from './types.ts';
export { layerAware, parameterBalanced, parameterBalancedCuts, plan, ringMemoryWeighted, stageSeconds } from './partition.ts';
export { layerCosts } from './from-model.ts';
