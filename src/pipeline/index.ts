export { type Action, bubbleFraction, gpipeActions, oneFOneBActions, type Schedule, schedule, type ScheduleName, stageActions } from './schedule.ts';
export { simulate, type Simulation } from './simulate.ts';
export { type ExecutorOptions, StageExecutor, TiedParameters } from './executor.ts';
export { type GradientCodec, GradientExchange, type GradientPayload, REDUCE_TIMEOUT_MS, type ReduceGroup } from './exchange.ts';
export { type Activation, isPassed, type Passed, type StageHandle } from './handle.ts';
export { LocalStage } from './local-stage.ts';
export { type PipelineStage, PipelineTrainer, type PipelineStepResult, type PipelineTrainerOptions } from './trainer.ts';
export { localPipeline, sectionCopy, sectionWeights, userEnds } from './ends.ts';
export { DeviceSection } from './device-stage.ts';
