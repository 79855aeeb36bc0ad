/**
 * TensorLink's public API: an explicit list of the names the README promises. Engine:
 * tensors with autograd (PyTorch's names), two backends (js: reproducible everywhere; ort:
 * fast). nn: modules, layers, optimizers, schedules. io: safetensors checkpoints. models:
 * GPT-2 and Llama in Hugging Face layout, tokenizers, generation. Swarms: nodes, the
 * validator and worker roles, `distribute` and local swarms. Everything else (stage
 * servers, result inboxes, wire formats) is internal and may change without notice.
 * @example
 * import { randn, Linear, AdamW, Generator } from 'tensorlink'
 * const layer = new Linear(4, 2, { rng: new Generator(0) })
 * const loss = layer.forward(randn([8, 4])).pow(2).mean()
 * loss.backward()
 * new AdamW(layer.parameters(), { lr: 1e-3 }).step()
 */
import './polyfills.ts';

export {
  AutogradError,
  BackendUnavailableError,
  ChainError,
  DeviceDataError,
  DeviceMismatchError,
  DeviceOpUnsupportedError,
  DTypeError,
  FileNotFoundError,
  InvalidArgumentError,
  InvalidMessageError,
  MemoryBudgetError,
  PeerUnreachableError,
  PlanInfeasibleError,
  RateLimitedError,
  SafetensorsFormatError,
  ShapeMismatchError,
  StageFailedError,
  StateDictError,
  TensorLinkError,
  TimeoutError,
  TraceError,
  UnauthorizedError,
  VerificationError,
} from './errors.ts';

// tensor/: the engine
export {
  add, arange, argmax, type AttentionOptions, type Backend, type BackendName, type BackwardOptions, cat, createOrtBackend, crossEntropy,
  type CrossEntropyOptions, div, dropout, type DType, embedding, exp, expand, flatten, type FloatArray, full, gather, gelu, Generator,
  getBackend, indexSelect, isGradEnabled, jsBackend, layerNorm, linear, log, logSoftmax, maskedFill, matmul, max, mean, mul, narrow, neg,
  noGrad, ones, ortAvailable, permute, poolStats, pow, rand, randint, randn, type RandomOptions, relu, reshape, rmsNorm, rotaryEmbedding,
  rsqrt, scaledDotProductAttention, setBackend, type Shape, sigmoid, silu, softmax, split, sqrt, squeeze, type StorageDType, sub, sum,
  tanh, Tensor, tensor, transpose, type TypedArray, unsqueeze, withBackend, ZeroGenerator, zeros,
} from './tensor/index.ts';
// devices, the backend registry and traced steps
export {
  type Allocator, backendNames, backendTolerance, type BackendFactory, type CompiledStep, CPU, createBackend, DeviceStorage,
  loadBackend, registerBackend, type Tolerance, trace, type TracedOp, TracedStep,
} from './tensor/index.ts';

// nn/ and io/: layers, optimizers, schedules; safetensors checkpoints
export {
  AdamW, type AdamWOptions, clipGradNorm, constantWithWarmup, cosineWithWarmup, Dropout, Embedding, type InitOptions, LayerNorm, Linear,
  LRScheduler, type LrLambda, Module, ModuleList, Optimizer, type ParamGroup, RMSNorm, SGD, type SGDOptions,
} from './nn/index.ts';
export {
  Checkpoint, INDEX_FILE, readSafetensors, type SafeDType, SafetensorsReader, SINGLE_FILE, type WriteOptions, writeCheckpoint,
  writeSafetensors,
} from './io/index.ts';

// models/ and data/: architectures, loading and saving, tokenizers, generation, local training; tasks and text
export {
  type BatchGenerator, byteLevelTokenizerJson, type CausalLM, configFromHF, configToHF, createModel, evaluateExactMatch, type EvalResult,
  type ForwardOptions, generate, generateBatch, type GenerateOptions, GPT2, type GPT2Config, gpt2Config, HFTokenizer, KVCache,
  type LayerKind, type LayerProfile, Llama, type LlamaConfig, llamaConfig, loadConfig, loadModel, loadTokenizer, LocalTrainer,
  type LocalTrainerOptions, type ModelConfig, type ModelLayer, type ModelPart, saveModel, type SamplingOptions, type SectionRange,
  type StepResult, type Tokenizer,
  type TrainingBatch, validateConfig,
} from './models/index.ts';
export {
  additionTask, type Batch, type Example, exactMatch, IGNORE_INDEX, loadTextFile, reverseTask, type Task, type TaskName, taskBatch,
  taskByName, type TextDataset, textBatch,
} from './data/index.ts';

// plan/ and pipeline/: partition strategies; schedules and the pipeline trainer
export { type Device, type LayerCost, layerAware, layerCosts, type Links, parameterBalanced, type Plan, plan, ringMemoryWeighted, type Stage, type StrategyName } from './plan/index.ts';
export {
  bubbleFraction, localPipeline, type PipelineStage, PipelineTrainer, type PipelineStepResult, type PipelineTrainerOptions,
  type ScheduleName, simulate,
} from './pipeline/index.ts';

// the swarm: nodes, roles, distributed jobs, local swarms
export { type Capabilities, createNode, type NodeOptions, type PeerRecord, type Proximity, type Role, type TensorLinkNode, type Tier } from './p2p/index.ts';
export {
  DEFAULT_SAMPLE_RATE, distribute, type DistributeOptions, type DistributedJob, type DistributedModel, type DistributedTrainerOptions,
  type JobStepResult, type JobTrainer, listPeers, type LoadProgress, type VerificationSummary, type VerifyOptions,
} from './user/index.ts';
// training with evaluation, checkpoints and resume (what `tensorlink train` runs), in this process or across workers
export {
  type Evaluation, jobRunner, type JobRunnerOptions, localRunner, type LocalRunnerOptions, readState, type Runner, runTraining, STATE_FILE,
  type StepReport, type TrainerState, type TrainingOptions, type TrainingResult, type TrainingSource, taskSource, textData, textSource,
} from './user/index.ts';
export { CHEAT_KINDS, type Fault, FAULT_KINDS, type FaultKind, startWorker, type Worker, type WorkerOptions } from './worker/index.ts';

// verify/: records, checks and scores (proof of learning)
export {
  agree, checkRecord, type ContributionScore, drift, expectedStepsToCatch, ORT_TOLERANCE, parseRecord, recordId, type RecordKind,
  Reputation, scoreContributions, type Standing, stepCatchProbability, stepsToCatch, type WorkRecord,
} from './verify/index.ts';
export { startValidator, type Validator, type ValidatorOptions } from './validator/index.ts';
export { type LocalPeer, type LocalSwarm, localSwarm } from './swarm/index.ts';
