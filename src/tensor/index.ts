export { type BackwardOptions, isGradEnabled, noGrad } from './autograd.ts';
export { type Backend, EXACT, type Tolerance, type ToleranceFormat } from './backends/backend.ts';
export { jsBackend, jsBackendWith } from './backends/js/backend.ts';
export { fastGemm, gemmNN, type GemmNN } from './kernels/matmul.ts';
export { createOrtBackend, ORT_BACKEND_TOLERANCE, ortAvailable } from './backends/ort/backend.ts';
export {
  backendDevice,
  type BackendFactory,
  backendNames,
  type BackendOptions,
  backendTolerance,
  createBackend,
  loadBackend,
  registerBackend,
} from './backends/registry.ts';
export { type BackendName, computeDevice, computeName, getBackend, setBackend, setComputeDevice, withBackend } from './backends/select.ts';
export { type Allocator, CPU, type Device, deviceOf, DeviceStorage } from './device.ts';
export { type CompiledStep, type Slot, type SlotKind, SlotRef, trace, type TracedOp, TracedStep } from './trace.ts';
export { compositeOp, isTracing } from './dispatch.ts';
export { addInto } from './kernels/rows.ts';
export { arange, drawsNothing, full, ones, type RandomOptions, rand, randint, randn, tensor, zeros } from './creation.ts';
export { bfloat16ToFloat, type DType, type FloatArray, floatToBfloat16, floatToHalf, halfToFloat, type StorageDType, type TypedArray } from './dtype.ts';
export { attendTimeMajor, type AttentionOptions, maskedSoftmax, type PagedTimeMajorKV, scaledDotProductAttention, type TimeMajorKV } from './ops/attention.ts';
export { geluErf } from './ops/gelu-erf.ts';
export { dropout } from './ops/dropout.ts';
export { rotaryEmbedding } from './ops/rope.ts';
export {
  bf16Matrix,
  blocksPerRow,
  emptyPacked,
  formatBytes,
  type PackedMatrix,
  packedBytes,
  packedFromBytes,
  packedToBytes,
  packMatrix,
  packRows,
  parseWeightFormat,
  QUANT_BLOCK,
  type QuantFormat,
  unpackMatrix,
  WEIGHT_FORMATS,
  type WeightFormat,
} from './quant/formats.ts';
export { holdPacked, packedTensor, packWeight, packWeightRows } from './quant/pack.ts';
export {
  add,
  div,
  exp,
  gelu,
  log,
  maskedFill,
  mul,
  neg,
  pow,
  relu,
  rsqrt,
  sigmoid,
  silu,
  sqrt,
  sub,
  tanh,
} from './ops/elementwise.ts';
export { embedding } from './ops/embedding.ts';
export { type CrossEntropyOptions, crossEntropy } from './ops/loss.ts';
export { gatedMlp, type LinearParams, linears } from './ops/fused.ts';
export { linear, matmul } from './ops/matmul.ts';
export { layerNorm, rmsNorm } from './ops/norm.ts';
export { argmax, max, mean, sum } from './ops/reduce.ts';
export {
  cat,
  expand,
  flatten,
  gather,
  indexSelect,
  narrow,
  permute,
  reshape,
  split,
  squeeze,
  transpose,
  unsqueeze,
} from './ops/shape.ts';
export { logSoftmax, softmax } from './ops/softmax.ts';
export { Generator, ZeroGenerator } from './random.ts';
export { drainPool, poolStats, releaseFloat32 } from './pool.ts';
export { type Shape, sizeOf } from './shape.ts';
export { Tensor } from './tensor.ts';
// a traced step as one ONNX graph (the lowerings every graph backend shares: ort's compileStep, webgpu, the tab's GPU)
export { encodeModel, OnnxType } from './backends/ort/onnx-graph.ts';
export { lowerStep, type Refusal, type StepGraph } from './backends/graph/step-graph.ts';
export type { GraphOptimizer } from './backends/graph/step-training.ts';
