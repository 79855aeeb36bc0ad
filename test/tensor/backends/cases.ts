/**
 * The cases of the backend conformance suite (suite.ts): every op of the engine, each as seeded inputs and the op.
 * Every op comes small (js work on every backend) and, where a backend has a kernel for it, large enough to cross
 * the ort backend's thresholds (ORT_MIN_ELEMENTS = 4096 elements for an elementwise op, a softmax or a layer norm;
 * ORT_MIN_MACS = 32 × 1024 multiply-adds for a product, src/tensor/backends/ort/backend.ts), so that its native path runs:
 * the suite's last test checks that every kernel the backend has took work. Inputs are drawn from a Generator and
 * changed only through their buffers, never through ops, so they are the same bits on every backend.
 */
import type { ComputeFormat } from '../../../src/verify/index.ts';
import {
  cat,
  crossEntropy,
  dropout,
  embedding,
  expand,
  flatten,
  gatedMlp,
  gather,
  Generator,
  indexSelect,
  layerNorm,
  linear,
  linears,
  logSoftmax,
  maskedFill,
  matmul,
  narrow,
  packedTensor,
  packMatrix,
  packWeight,
  permute,
  randn,
  reshape,
  rmsNorm,
  rotaryEmbedding,
  scaledDotProductAttention,
  softmax,
  split,
  squeeze,
  type Tensor,
  tensor,
  transpose,
  unsqueeze,
} from '../../../src/tensor/index.ts';
import { attendTimeMajor } from '../../../src/tensor/ops/attention.ts';
import { geluErf } from '../../../src/tensor/ops/gelu-erf.ts';

export interface ConformanceCase {
  readonly name: string;
  /** The format of the weights it computes with: the tolerance that applies ('f32' unless a weight is compact). */
  readonly format: ComputeFormat;
  /** Its inputs, drawn from `g` (seeded the same on every run). Float inputs take gradients, but for compact weights. */
  readonly inputs: (g: Generator) => Tensor[];
  /** The op: its output, or outputs. */
  readonly run: (...xs: Tensor[]) => Tensor | Tensor[];
  /** Runs without gradients: the fused products (linears, gatedMlp) take a backend's kernel only then. */
  readonly noGrad?: boolean;
  /** float32 only (compact weights, time-major attention): no float64 reference on js. */
  readonly float32Only?: boolean;
}

/** Standard normal values of `shape`, times `scale`. */
const normal = (g: Generator, shape: number[], scale = 1): Tensor => {
  const t = randn(shape, { generator: g });
  if (scale !== 1) for (let i = 0; i < t.size; i++) t.data[i] *= scale;
  return t;
};

/** Values in [0.5, 2.5): away from the poles and kinks of log, sqrt, rsqrt, pow and div. */
const positive = (g: Generator, shape: number[]): Tensor => {
  const t = randn(shape, { generator: g });
  for (let i = 0; i < t.size; i++) t.data[i] = 0.5 + Math.min(2, Math.abs(t.data[i]));
  return t;
};

/** Integers in [0, n) as int32 (ids, targets, indices). */
const ids = (g: Generator, shape: number[], n: number): Tensor => {
  const size = shape.reduce((a, b) => a * b, 1);
  return tensor(Array.from({ length: size }, () => Math.floor(g.uniform() * n)), shape, 'int32');
};

/** A [rows, cols] weight at a linear layer's initial scale, held in `format` where it is not float32. */
const weight = (g: Generator, rows: number, cols: number, format: ComputeFormat): Tensor => {
  const w = normal(g, [rows, cols], 1 / Math.sqrt(cols));
  if (format !== 'f32') packWeight(w, format);
  return w;
};

/** cos and sin tables [1, T, D] of rotary embeddings (rotate-half layout: each frequency twice). */
const rotary = (t: number, d: number): [Tensor, Tensor] => {
  const cos = new Float32Array(t * d);
  const sin = new Float32Array(t * d);
  for (let p = 0; p < t; p++) {
    for (let i = 0; i < d; i++) {
      const angle = p / 10000 ** ((2 * (i % (d / 2))) / d);
      cos[p * d + i] = Math.cos(angle);
      sin[p * d + i] = Math.sin(angle);
    }
  }
  return [tensor(cos, [1, t, d]), tensor(sin, [1, t, d])];
};

const f32 = (name: string, inputs: ConformanceCase['inputs'], run: ConformanceCase['run'], extra: Partial<ConformanceCase> = {}): ConformanceCase =>
  ({ name, format: 'f32', inputs, run, ...extra });

/** Small: js work on every backend. Wide: 8 × 520 = 4160 elements, above ORT_MIN_ELEMENTS. */
const SIZES = { small: [3, 5], wide: [8, 520] } as const;

const UNARY = ['neg', 'exp', 'log', 'sqrt', 'rsqrt', 'tanh', 'sigmoid', 'silu', 'gelu', 'relu'] as const;
const ON_POSITIVES: ReadonlySet<string> = new Set(['log', 'sqrt', 'rsqrt']);

const elementwise: ConformanceCase[] = Object.entries(SIZES).flatMap(([size, s]) => [
  ...UNARY.map((op) => f32(`${op} (${size})`, (g) => [ON_POSITIVES.has(op) ? positive(g, [...s]) : normal(g, [...s])], (x) => x[op]())),
  f32(`geluErf (${size})`, (g) => [normal(g, [...s])], (x) => geluErf(x)),
  f32(`pow by 3 (${size})`, (g) => [normal(g, [...s])], (x) => x.pow(3)),
  f32(`pow by a tensor (${size})`, (g) => [positive(g, [...s]), normal(g, [...s])], (x, p) => x.pow(p)),
]);

const BROADCASTS: [string, number[], number[]][] = [
  ['[4, 1, 6] by [3, 1]', [4, 1, 6], [3, 1]],
  ['[2, 64, 40] by [40] (wide)', [2, 64, 40], [40]],
  ['[5, 6] by [5, 6]', [5, 6], [5, 6]],
];

const binary: ConformanceCase[] = [
  ...BROADCASTS.flatMap(([label, a, b]) => [
    f32(`add ${label}`, (g) => [normal(g, a), normal(g, b)], (x, y) => x.add(y)),
    f32(`sub ${label}`, (g) => [normal(g, a), normal(g, b)], (x, y) => x.sub(y)),
    f32(`mul ${label}`, (g) => [normal(g, a), normal(g, b)], (x, y) => x.mul(y)),
    f32(`div ${label}`, (g) => [normal(g, a), positive(g, b)], (x, y) => x.div(y)),
  ]),
  f32('add, sub, mul, div by scalars', (g) => [normal(g, [4, 6])], (x) => x.add(1.5).sub(0.25).mul(-2).div(3)),
  f32('maskedFill', (g) => [normal(g, [3, 4]), ids(g, [1, 4], 2)], (x, m) => maskedFill(x, m, -2)),
  f32('dropout (seeded)', (g) => [normal(g, [6, 40])], (x) => dropout(x, 0.3, new Generator(5))),
];

const reductions: ConformanceCase[] = [
  f32('sum (all)', (g) => [normal(g, [3, 4, 5])], (x) => x.sum()),
  f32('sum over dims [0, 2]', (g) => [normal(g, [3, 4, 5])], (x) => x.sum([0, 2])),
  f32('sum keepdim', (g) => [normal(g, [3, 4, 5])], (x) => x.sum(1, true)),
  f32('sum over rows (wide)', (g) => [normal(g, [64, 80])], (x) => x.sum(0)),
  f32('mean over the last dim', (g) => [normal(g, [3, 4, 5])], (x) => x.mean(-1)),
  f32('mean (all)', (g) => [normal(g, [3, 4, 5])], (x) => x.mean()),
  f32('max over a dim', (g) => [normal(g, [3, 4, 5])], (x) => x.max(1)),
  f32('max (all)', (g) => [normal(g, [3, 4])], (x) => x.max()),
  f32('argmax', (g) => [normal(g, [3, 4, 5])], (x) => x.argmax(-1)),
];

const shapes: ConformanceCase[] = [
  f32('reshape', (g) => [normal(g, [2, 3, 4])], (x) => reshape(x, [4, 6])),
  f32('view', (g) => [normal(g, [2, 3, 4])], (x) => x.view([6, 4])),
  f32('flatten', (g) => [normal(g, [2, 3, 2])], (x) => flatten(x, 1)),
  f32('transpose', (g) => [normal(g, [2, 3, 4])], (x) => transpose(x, 0, 2)),
  f32('permute', (g) => [normal(g, [2, 3, 4])], (x) => permute(x, [2, 0, 1])),
  f32('narrow', (g) => [normal(g, [2, 4, 3])], (x) => narrow(x, 1, 1, 2)),
  f32('unsqueeze, squeeze', (g) => [normal(g, [3, 1, 2])], (x) => unsqueeze(squeeze(x, 1), 0)),
  f32('expand', (g) => [normal(g, [1, 3, 1])], (x) => expand(x, [2, 3, 4])),
  f32('split', (g) => [normal(g, [2, 5])], (x) => split(x, [1, 4], 1)),
  f32('cat', (g) => [normal(g, [2, 2, 3]), normal(g, [2, 3, 3])], (a, b) => cat([a, b], 1)),
  f32('gather', (g) => [normal(g, [3, 5]), ids(g, [3, 4], 5)], (x, i) => gather(x, 1, i)),
  f32('indexSelect', (g) => [normal(g, [5, 3]), ids(g, [4], 5)], (x, i) => indexSelect(x, 0, i)),
  f32('contiguous of a transpose', (g) => [normal(g, [3, 4])], (x) => x.transpose(0, 1).contiguous()),
  f32('clone', (g) => [normal(g, [3, 4])], (x) => x.clone()),
];

/** [a shape, b shape, label]: the small ones stay in js, the rest cross ORT_MIN_MACS (the last above a million MACs). */
const PRODUCTS: [number[], number[], string][] = [
  [[3, 4], [4, 5], '2-D (small)'],
  [[2, 3, 4], [2, 4, 5], 'batched (small)'],
  [[4, 1, 3, 4], [3, 4, 2], 'broadcast batch (small)'],
  [[2, 3, 4], [4, 5], '3-D by 2-D (small)'],
  [[4], [4, 3], 'vector by matrix (small)'],
  [[64, 96], [96, 80], '2-D'],
  [[3, 16, 32], [3, 32, 80], 'batched'],
  [[4, 1, 32, 32], [3, 32, 32], 'broadcast batch'],
  [[2, 16, 32], [32, 80], '3-D by 2-D'],
  [[128, 96], [96, 96], '2-D above a million MACs'],
];

const products: ConformanceCase[] = [
  ...PRODUCTS.map(([a, b, label]) => f32(`matmul ${label}`, (g) => [normal(g, a), normal(g, b)], (x, y) => matmul(x, y))),
  f32('matmul by a transposed right operand', (g) => [normal(g, [48, 64]), normal(g, [80, 64])], (x, y) => matmul(x, y.transpose(0, 1))),
  f32('matmul of a transposed left operand', (g) => [normal(g, [64, 48]), normal(g, [64, 80])], (x, y) => matmul(x.transpose(0, 1), y)),
  f32('matmul batched, both transposed', (g) => [normal(g, [2, 32, 24]), normal(g, [2, 40, 32])], (x, y) => matmul(x.transpose(1, 2), y.transpose(1, 2))),
];

const FORMATS: readonly ComputeFormat[] = ['f32', 'bf16', 'int8', 'int4'];
/** [x shape, rows of the weight]: 2·3·64·48 = 18k MACs stays in js; 4·16·96·80 = 491k crosses ORT_MIN_MACS. */
const LINEARS: [number[], number, string][] = [
  [[2, 3, 64], 48, 'small'],
  [[4, 16, 96], 80, 'large'],
];

const compactOnly = (format: ComputeFormat) => (format === 'f32' ? {} : { float32Only: true });

const weighted: ConformanceCase[] = FORMATS.flatMap((format) => [
  ...LINEARS.map(([x, rows, size]): ConformanceCase => ({
    name: `linear with bias, ${format} weight (${size})`,
    format,
    inputs: (g) => [normal(g, x), weight(g, rows, x[x.length - 1], format), normal(g, [rows])],
    run: (a, w, b) => linear(a, w, b),
    ...compactOnly(format),
  })),
  {
    name: `linear [in, out] (Conv1D), ${format} weight`,
    format,
    inputs: (g) => [normal(g, [2, 8, 64]), weight(g, 64, 96, format)],
    run: (a, w) => linear(a, w, null, true),
    ...compactOnly(format),
  },
  ...[false, true].map((noGrad): ConformanceCase => ({
    name: `linears (q, k, v), ${format} weights${noGrad ? ', without gradients (fused)' : ''}`,
    format,
    inputs: (g) => [
      normal(g, [2, 16, 96]), weight(g, 96, 96, format), weight(g, 32, 96, format), normal(g, [32]), weight(g, 32, 96, format),
    ],
    run: (a, q, k, kb, v) => linears(a, [{ weight: q, bias: null }, { weight: k, bias: kb }, { weight: v, bias: null }]),
    noGrad,
    ...compactOnly(format),
  })),
  ...[false, true].map((noGrad): ConformanceCase => ({
    name: `gatedMlp, ${format} weights${noGrad ? ', without gradients (fused)' : ''}`,
    format,
    inputs: (g) => [normal(g, [2, 8, 96]), weight(g, 160, 96, format), weight(g, 160, 96, format), weight(g, 96, 160, format)],
    run: (a, gate, up, down) => gatedMlp(a, { weight: gate, bias: null }, { weight: up, bias: null }, { weight: down, bias: null }),
    noGrad,
    ...compactOnly(format),
  })),
  {
    name: `embedding, ${format} table`,
    format,
    inputs: (g) => [ids(g, [2, 7], 50), weight(g, 50, 64, format)],
    run: (i, w) => embedding(i, w),
    ...compactOnly(format),
  },
]);

/** A weight that arrived compact (a GGUF's blocks, a shard of int8): packedTensor, its float32 buffer never written. */
const arrived: ConformanceCase[] = (['bf16', 'int8', 'int4'] as const).map((format) => ({
  name: `linear with a weight that arrived ${format} (packedTensor, large)`,
  format,
  inputs: (g) => [normal(g, [4, 16, 96]), packedTensor(packMatrix(normal(g, [80, 96], 0.1).data, 80, 96, format))],
  run: (a, w) => linear(a, w),
  float32Only: true,
}));

const norms: ConformanceCase[] = [
  f32('layerNorm (small)', (g) => [normal(g, [3, 5]), normal(g, [5]), normal(g, [5])], (x, w, b) => layerNorm(x, w, b)),
  f32('layerNorm (wide)', (g) => [normal(g, [2, 48, 96]), normal(g, [96]), normal(g, [96])], (x, w, b) => layerNorm(x, w, b, 1e-5)),
  f32('layerNorm without affine (wide)', (g) => [normal(g, [2, 48, 96])], (x) => layerNorm(x)),
  f32('rmsNorm (small)', (g) => [normal(g, [3, 5]), normal(g, [5])], (x, w) => rmsNorm(x, w)),
  f32('rmsNorm (wide)', (g) => [normal(g, [2, 48, 96]), normal(g, [96])], (x, w) => rmsNorm(x, w, 1e-6)),
  f32('rmsNorm without weight', (g) => [normal(g, [4, 24])], (x) => rmsNorm(x)),
];

const softmaxes: ConformanceCase[] = [
  f32('softmax over the last dim', (g) => [normal(g, [3, 7])], (x) => softmax(x, -1)),
  f32('softmax over dim 1', (g) => [normal(g, [2, 5, 3])], (x) => softmax(x, 1)),
  f32('softmax (wide)', (g) => [normal(g, [16, 300], 3)], (x) => x.softmax(-1)),
  f32('logSoftmax', (g) => [normal(g, [3, 7])], (x) => logSoftmax(x, -1)),
  f32('logSoftmax (wide)', (g) => [normal(g, [16, 300], 3)], (x) => x.logSoftmax(-1)),
  f32('crossEntropy', (g) => [normal(g, [2, 4, 11]), ids(g, [2, 4], 11)], (x, t) => crossEntropy(x, t)),
  f32('crossEntropy over a divisor', (g) => [normal(g, [2, 4, 11]), ids(g, [2, 4], 11)], (x, t) => crossEntropy(x, t, { divisor: 20 })),
  f32('crossEntropy ignoring −100, summed', (g) => {
    const t = ids(g, [2, 6], 13);
    t.data[3] = -100;
    t.data[10] = -100;
    return [normal(g, [2, 6, 13]), t];
  }, (x, t) => crossEntropy(x, t, { reduction: 'sum' })),
  f32('crossEntropy per position (wide)', (g) => [normal(g, [4, 16, 320]), ids(g, [4, 16], 320)], (x, t) => crossEntropy(x, t, { reduction: 'none' })),
];

/** HF's repeat_kv: [B, Hkv, T, D] → [B, Hkv·groups, T, D] (grouped-query attention over the shared key heads). */
const repeatKv = (x: Tensor, groups: number): Tensor => {
  const [b, h, t, d] = x.shape;
  return x.unsqueeze(2).expand([b, h, groups, t, d]).reshape([b, h * groups, t, d]);
};

/**
 * [label, q shape, k and v shape, causal]. The large ones: 2·3·24·40 = 5760 scores (above ORT_MIN_ELEMENTS, so the
 * masked softmax runs natively) and 92k MACs per product.
 */
const ATTENTION: [string, number[], number[], boolean][] = [
  ['causal (small)', [1, 2, 4, 8], [1, 2, 4, 8], true],
  ['causal', [2, 3, 24, 16], [2, 3, 24, 16], true],
  ['causal over 16 cached keys', [2, 3, 24, 16], [2, 3, 40, 16], true],
  ['full', [2, 3, 24, 16], [2, 3, 40, 16], false],
];

const attention: ConformanceCase[] = [
  ...ATTENTION.map(([label, q, kv, causal]) =>
    f32(`scaledDotProductAttention ${label}`, (g) => [normal(g, q), normal(g, kv), normal(g, kv)], (a, k, v) => scaledDotProductAttention(a, k, v, { causal }))),
  f32('scaledDotProductAttention with a key mask', (g) => {
    const mask = ids(g, [2, 1, 1, 12], 2);
    mask.data[0] = 1;
    mask.data[12] = 1;
    return [normal(g, [2, 2, 6, 8]), normal(g, [2, 2, 12, 8]), normal(g, [2, 2, 12, 8]), mask];
  }, (a, k, v, m) => scaledDotProductAttention(a, k, v, { causal: true, mask: m })),
  // left padding: the first keys masked, so the first queries (padding) have no key left: their rows are zeros
  f32('scaledDotProductAttention, causal, the first keys masked (rows with no key)', (g) => {
    const mask = tensor(Int32Array.from({ length: 2 * 8 }, (_, i) => (i % 8 < 3 ? 0 : 1)), [2, 1, 1, 8], 'int32');
    return [normal(g, [2, 2, 8, 8]), normal(g, [2, 2, 8, 8]), normal(g, [2, 2, 8, 8]), mask];
  }, (a, k, v, m) => scaledDotProductAttention(a, k, v, { causal: true, mask: m })),
  f32('scaledDotProductAttention, grouped-query (4 heads over 2)', (g) => [normal(g, [2, 4, 24, 16]), normal(g, [2, 2, 40, 16]), normal(g, [2, 2, 40, 16])],
    (a, k, v) => scaledDotProductAttention(a, repeatKv(k, 2), repeatKv(v, 2), { causal: true })),
  ...([
    // 2·4·8·32·16 = 32768 MACs: the backend's attention kernel (ORT_MIN_MACS), prefill after 24 cached positions
    ['prefill', 4, 2, 8, 32],
    // one query of 8 heads over 2 key heads and 128 positions: decoding
    ['decoding', 8, 2, 1, 128],
    ['small', 2, 1, 3, 5],
  ] as const).map(([label, heads, kvHeads, tq, tk]): ConformanceCase => ({
    name: `attendTimeMajor, grouped-query (${heads} heads over ${kvHeads}), ${label}`,
    format: 'f32',
    float32Only: true,
    // q [2, heads, tq, 16]; k and v time-major [2, capacity, kvHeads, 16] with 4 positions of room
    inputs: (g) => [normal(g, [2, heads, tq, 16]), normal(g, [2, tk + 4, kvHeads, 16]), normal(g, [2, tk + 4, kvHeads, 16])],
    run: (q, k, v) => attendTimeMajor(q.detach(), {
      k: k.data as Float32Array, v: v.data as Float32Array, capacity: tk + 4, length: tk, kvHeads,
    }),
  })),
  f32('rotaryEmbedding', (g) => [normal(g, [2, 4, 8, 16]), ...rotary(8, 16)], (x, cos, sin) => rotaryEmbedding(x, cos, sin)),
];

/** Every case, by area: elementwise, broadcasting, reductions, shapes, products, weights, norms, softmax, attention. */
export const CASES: readonly ConformanceCase[] = [
  ...elementwise, ...binary, ...reductions, ...shapes, ...products, ...weighted, ...arrived, ...norms, ...softmaxes, ...attention,
];
