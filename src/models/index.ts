export { type DecoderConfig, decoderConfig, type ModelConfig } from './config.ts';
export {
  configFromHF, configToHF, countParameters, FAMILIES, type Family, familyNamed, familyNames, familyOf, ggufWritten, type NamedShape,
  type SmallShape, validateConfig,
} from './families/index.ts';
export { GPT2, type GPT2Config, gpt2Config } from './families/gpt2.ts';
export { Bloom, type BloomConfig, bloomConfig } from './families/bloom.ts';
export { Falcon, type FalconConfig, falconConfig } from './families/falcon.ts';
export { Gemma, type GemmaConfig, gemmaConfig } from './families/gemma.ts';
export { GPTNeoX, type GPTNeoXConfig, gptNeoXConfig } from './families/gpt-neox.ts';
export { Llama, type LlamaConfig, llamaConfig } from './families/llama.ts';
export { Mixtral, type MixtralConfig, mixtralConfig } from './families/mixtral.ts';
export { Qwen3Moe, type Qwen3MoeConfig, qwen3MoeConfig } from './families/qwen3-moe.ts';
export { SparseMoe } from './moe.ts';
export { Decoder, rotaryTables } from './decoder.ts';
export { canDecodeRows, decodeRows, type DecodeRow } from './generation/decode-batch.ts';
export {
  compactWeight, createModel, heldBytes, isGGUF, loadChatTemplate, loadConfig, loadModel, type LoadOptions, loadTokenizer, modelLayers,
  partBytes, partHeldBytes, saveModel, saveModelStreamed, weightBytes, weightFormat, writeModelFiles,
} from './checkpoints/hf.ts';
export { CheckpointWeights, defaultCacheDir, layersOfWeight, type ModelWeights, type WeightShape } from './checkpoints/checkpoint-weights.ts';
export { GGUFWeights } from './checkpoints/gguf-weights.ts';
export { defaultPositions, runLayers } from './forward.ts';
export { type ModelPart, partLayers, type SectionParts, type SectionRange, sectionParts } from './model.ts';
export {
  type CausalLM,
  type ForwardContext,
  type ForwardOptions,
  GrowingKV,
  KVCache,
  type LayerCache,
  type SharedPages,
  type LayerKind,
  layerParameters,
  type LayerProfile,
  type ModelLayer,
} from './model.ts';
export { KV_PAGE_SIZE, type KVPage, KVPagePool, PagedKV } from './kv-pages.ts';
export { byteLevelTokenizerJson, HFTokenizer, promptIds, type Tokenizer } from './tokenizer.ts';
export { generate, generateBatch, type GenerateOptions, generateWith, localStepModel, type RowOptions, type StepModel } from './generation/generate.ts';
export {
  DeviceRunner, deviceRunner, deviceStepModel, type PastShape, registerStepRunner, type StepRunner, traceCachedStep,
} from './generation/device-step.ts';
export { logSumExp, sampleToken, type SamplingOptions } from './generation/sampling.ts';
export {
  cutStep, type DraftKind, type Drafter, generateSpeculative, lookupDraft, modelDrafter, type SpeculativeOptions, type SpeculativeResult,
} from './generation/speculative.ts';
export {
  type BatchObjective,
  countTargets,
  LocalTrainer,
  type LocalTrainerOptions,
  microBatchLoss,
  splitBatch,
  type StepResult,
  trainingOptimizer,
  type TrainingBatch,
  trainingSchedule,
} from './trainer.ts';
export { type BatchGenerator, evaluateExactMatch, type EvalResult } from './evaluate.ts';
export { GGUFModel, type GGUFFileType, ggufToHF, hfToGGUF, type HFToGGUFOptions } from './checkpoints/gguf-model.ts';
export {
  type Adaptable, adaptModel, AdapterSet, ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapterBytes, adapterParameters, adapterState,
  DEFAULT_LORA_TARGETS, isAdapterWeight, loadAdapter, type LoraConfig, loraScale, mergeAdapter, parseLoraSpec, readAdapterConfig,
  saveAdapter, weightsWithAdapter, writeAdapter,
} from './adapters/adapter.ts';
export { PREFIX_IDLE_BYTES, PrefixCache, prefillShared } from './prefix-cache.ts';
