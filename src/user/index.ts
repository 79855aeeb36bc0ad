/** The user's room: `distribute` and the distributed job, remote stages, the result inbox, the validator's peer list. */
export { distribute, type DistributeOptions, planLinks, plannedSwarm } from './distribute.ts';
export { jobPlanOptions, memoryFactor, surveyWorkers } from './survey.ts';
export { type AdapterOption, type JobAdapter, jobAdapter } from './job-adapter.ts';
export {
  DistributedJob, type DistributedModel, type DistributedTrainerOptions, type JobStage, LOAD_CONCURRENCY, LOST_AVOID_MS,
  type ReplanEvent, REPLAN_CHECK_MS, SNAPSHOT_INTERVAL_MS, SNAPSHOT_MAX_BYTES,
} from './job.ts';
export { fetchOverview, listPeers, listWorkers } from './peers.ts';
export { CLOSE_WAIT_MS, PROGRESS_INTERVAL_MS, PROGRESS_TIMEOUT_MS, ProgressReporter } from './progress.ts';
export { controlAnswer, type LoadOptions, type LoadProgress, type LoadResult, RemoteStage, tensorAnswer } from './remote-stage.ts';
export { checkpointSource, type SectionSource, tensorSource } from './section-source.ts';
export { modelFromCheckpoint, modelInMemory, type UserModel } from './user-model.ts';
export { type JobStepResult, JobTrainer } from './job-trainer.ts';
export { RedundantStage } from './redundant-stage.ts';
export { RemoteTrainStage } from './remote-train.ts';
export { DEFAULT_SAMPLE_RATE, JobVerifier, NEWCOMER_CHECKS, NEWCOMER_RATE, type VerificationSummary, type VerifyOptions } from './verifier.ts';
export { ResultInbox } from './result-inbox.ts';
export {
  DEADLINE_FLOOR_MS, DEADLINE_SLACK, deadlineMs, type FailoverEvent, LIVENESS_TIMEOUT_MS, STEP_RETRIES,
} from './failover.ts';
export type { JobProgress, JobView, LedgerSummary, Overview, OverviewEvent } from '../p2p/index.ts';
export { allModels, listModels } from './model-index.ts';
export { HostedModel, type HostedVerify, type RouteHop, type RouteOptions, routeOver } from './hosted.ts';
export { HostedSession } from './hosted-session.ts';
export { cachedEnds, findHosted, pullEnds, type PulledEnds, type PullEndsOptions } from './pull-ends.ts';
export {
  EVAL_TOKENS, type Evaluation, type Evaluator, jobRunner, type JobRunnerOptions, localOptimizerState, localRunner,
  type LocalRunnerOptions, openOptimizer, type OptimizerState, readOptimizer, readState, type Runner, runTraining, setLocalOptimizerState,
  STATE_FILE, type StepReport, type TrainerState, type TrainingOptions, type TrainingResult, type TrainingSource, taskSource, textData,
  textSource, writeOptimizer, writeOptimizerStreamed, writeState,
} from './training/index.ts';
export { type ReplicaRound, type RoundReport, type ScoreOptions } from './scoring.ts';
