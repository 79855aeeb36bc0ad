export { Tensor } from './tensor.ts';
export { noGrad, isGradEnabled, type BackwardOptions } from './autograd.ts';
export { tensor, zeros, ones, full, arange, randn, rand, randint, type RandomOptions } from './creation.ts';
export { Generator } from './random.ts';
export type { DType, StorageDType, TypedArray, FloatArray } from './dtype.ts';
export type { Shape } from './shape.ts';
export type { Backend } from './backends/backend.ts';
export { getBackend, setBackend, withBackend, type BackendName } from './backends/select.ts';
export { createOrtBackend, ortAvailable } from './backends/ort.ts';
export { jsBackend } from './backends/js.ts';
export {
  add,
  sub,
  mul,
  div,
  pow,
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  silu,
  gelu,
  relu,
  maskedFill,
} from './ops/elementwise.ts';
export { sum, mean, max, argmax } from './ops/reduce.ts';
export {
  reshape,
  permute,
  transpose,
  narrow,
  cat,
  split,
  expand,
  gather,
  indexSelect,
  unsqueeze,
  squeeze,
  flatten,
} from './ops/shape.ts';
export { matmul, linear } from './ops/matmul.ts';
export { softmax, logSoftmax } from './ops/softmax.ts';
export { layerNorm, rmsNorm } from './ops/norm.ts';
export { embedding } from './ops/embedding.ts';
export { scaledDotProductAttention, type AttentionOptions } from './ops/attention.ts';
export { crossEntropy, type CrossEntropyOptions } from './ops/loss.ts';
export { dropout } from './ops/dropout.ts';
