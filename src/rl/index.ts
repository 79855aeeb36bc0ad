/** The RL room: GRPO's objective, rollouts from the swarm's hosted models, a policy's adapter pushed to its hosts. */
export {
  ADVANTAGE_EPS, type AdvantageScale, groupAdvantages, grpoLoss, type GrpoBatch, type GrpoOptions, type GrpoPreset, GRPO_PRESETS,
  type GrpoStats, type LossAggregation, tokenLogprobs,
} from './grpo.ts';
