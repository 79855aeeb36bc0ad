/** Training a model, in this process or across workers: the loop with evaluation, checkpoints and resume, and its data. */
export { runTraining, type StepReport, type TrainingOptions, type TrainingResult } from './loop.ts';
export { jobRunner, type JobRunnerOptions, localRunner, type LocalRunnerOptions, type Runner } from './runner.ts';
export { EVAL_TOKENS, type Evaluation, type Evaluator, taskSource, textData, textSource, type TrainingSource } from './sources.ts';
export {
  localOptimizerState, openOptimizer, type OptimizerState, readOptimizer, readState, setLocalOptimizerState, STATE_FILE, type TrainerState,
  writeOptimizer, writeOptimizerStreamed, writeState,
} from './state.ts';
