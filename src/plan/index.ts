export type { Device, LayerCost, Links, Plan, PlanOptions, Stage, StrategyName, Traffic } from './types.ts';
export { evaluatePlan, layerAware, parameterBalanced, parameterBalancedCuts, plan, ringMemoryWeighted, stageSeconds, stepSeconds } from './partition.ts';
export { DEFAULT_BANDWIDTH, DEFAULT_LATENCY, type Hop, hopSeconds, stageHops, stageTimer } from './cost.ts';
export { estimateOf, type LinkEstimate, linkBetween, type LinkMeasurement, linkTable, type LinkTable, mbitOf, measuredLinks, MIN_MBPS } from './links.ts';
export { REPLAN_GAIN, replan, type Replan, type ReplanInput, shortName, type Swarm } from './replan.ts';
export { layerCosts } from './from-model.ts';
export { PLAN_CANDIDATES, planCandidates } from './candidates.ts';
export { type Coordinate, estimateRttMs, fitCoordinate, MAX_COORDINATE_MS, MAX_ERROR, MIN_HEIGHT_MS, origin, updateCoordinate } from './vivaldi.ts';
