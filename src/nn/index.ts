export { Dropout, Embedding, type InitOptions, LayerNorm, Linear, type Lora, LORA_PARAM_PREFIX, newLora, RMSNorm } from './layers.ts';
export { Module, ModuleList } from './module.ts';
export { AdamW, type AdamWOptions } from './optim/adamw.ts';
export { clipGradNorm, clipScale, gradNormSquared, scaleGrads } from './optim/clip.ts';
export { Optimizer, type ParamGroup } from './optim/optimizer.ts';
export { constantWithWarmup, cosineWithWarmup, LRScheduler, type LrLambda } from './optim/schedule.ts';
export { SGD, type SGDOptions } from './optim/sgd.ts';
