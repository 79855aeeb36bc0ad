/** The RL room: GRPO's objective, rollouts from a policy (in this process or across the swarm), tasks, the loop. */
export {
  ADVANTAGE_EPS, type AdvantageScale, groupAdvantages, grpoLoss, type GrpoBatch, type GrpoOptions, type GrpoPreset, GRPO_PRESETS,
  type GrpoStats, type LossAggregation, tokenLogprobs,
} from './grpo.ts';
export { generateRollouts, grpoBatch, type PackedRollouts, packRollouts, type Rollout, type RolloutGenerator } from './rollouts.ts';
export { exactAnswerTask, jsonTask, loadTask, type RlTask, rlTaskByName } from './tasks.ts';
export { heldOutAccuracy, type Policy, rl, type RlOptions, type RlResult, type RlStepStats } from './rl.ts';
export { jobPolicy, localPolicy, type LogitsSource, type RolloutJob } from './policies.ts';
