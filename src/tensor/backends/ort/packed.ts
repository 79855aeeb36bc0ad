import { bitsOf, blobBytes, blocksPerRow, type PackedMatrix, QUANT_BLOCK, type QuantFormat } from '../../quant/formats.ts';
import { encodeModel, type Initializer, type NodeSpec, OnnxType } from './onnx-graph.ts';

/**
 * y [M, N] = a [M, K] · Wᵀ for an int8 or int4 matrix W [N, K] through onnxruntime's `com.microsoft` `MatMulNBits`,
 * with the weights held in the graph as initializers: onnxruntime prepacks only constant initializers for its
 * blockwise kernels (as graph inputs they would be packed again at every run). Each session holds its own prepacked
 * copy beside our PackedMatrix (measured RSS per extra session of a 4096×4096 weight: 21 MB for int4's 10 MB, 31 MB for
 * int8's 18 MB, allocator slack included).
 */

/**
 * How MatMulNBits computes: 4 quantizes each block of 32 of A to int8 (scale amax / 127) and multiplies in integers
 * (MLAS's CompInt8), the fast path on CPUs with dot-product instructions; 0 keeps A in float32. For 4096×4096, M = 1,
 * one thread (AVX-512 VNNI): int4 0.26 ms at 4, 1.0 ms at 0; int8 0.74 ms at 4, 373 ms at 0 (no float kernel for
 * 8 bits). The price of 4: the output moves by up to ~6e-3 of its largest value (test/tensor/ort-packed.test.ts).
 */
export const ACCURACY_LEVEL = 4;

/**
 * Our layout is MatMulNBits' (quant/formats.ts): B [N, blocks, blob] unsigned, scales [N · blocks]. Its zero point
 * is the operator's default 2^(bits − 1) (128, or 8), so no zero_points input (tested: test/tensor/ort-packed.test.ts).
 */
export function matMulNBitsGraph(p: PackedMatrix & { format: QuantFormat }, accuracyLevel: number = ACCURACY_LEVEL): Uint8Array {
  const { rows: n, cols: k, format } = p;
  const blocks = blocksPerRow(k);
  const initializers: Initializer[] = [
    { name: 'b', dims: [n, blocks, blobBytes(format)], data: p.data as Uint8Array },
    { name: 'scales', dims: [n * blocks], data: p.scales },
  ];
  const node: NodeSpec = {
    op: 'MatMulNBits',
    domain: 'com.microsoft',
    inputs: ['a', 'b', 'scales'],
    outputs: ['y'],
    attributes: { K: k, N: n, bits: bitsOf(format), block_size: QUANT_BLOCK, accuracy_level: accuracyLevel },
  };
  return encodeModel(
    [node],
    [{ name: 'a', type: OnnxType.float32, shape: ['m', k] }],
    [{ name: 'y', type: OnnxType.float32, shape: ['m', n] }],
    17,
    { initializers, opsets: { 'com.microsoft': 1 } },
  );
}

/** Weights of a bf16 matrix widened to float32 at a time (a scratch of 256 KiB, which stays in a core's L2 cache). */
export const BF16_CHUNK_ELEMENTS = 64 * 1024;

/**
 * y [m, rows] = x [m, cols] · Wᵀ for a bf16 W through a dense float32 product, `chunk` rows at a time: each chunk of
 * rows is widened into a float32 scratch (a bf16 value is the upper half of its float32, so this is exact) and
 * `product(a, m, b, rows, out)` writes out [m, rows] = a · bᵀ. The float32 matrix never exists whole, so bf16 keeps
 * its memory; the widening (one shift per weight in js) is the price of each call.
 */
export function bf16LinearChunked(
  x: Float32Array,
  m: number,
  p: PackedMatrix,
  y: Float32Array,
  product: (b: Float32Array, rows: number, out: Float32Array) => void,
  chunk = BF16_CHUNK_ELEMENTS,
): void {
  const { rows: n, cols: k } = p;
  const bits = p.data as Uint16Array;
  const per = Math.max(1, Math.min(n, Math.floor(chunk / k)));
  const scratch = new Float32Array(per * k);
  const wide = new Uint32Array(scratch.buffer);
  const out = m === 1 ? null : new Float32Array(m * per);
  for (let r0 = 0; r0 < n; r0 += per) {
    const rows = Math.min(per, n - r0);
    const base = r0 * k;
    const count = rows * k;
    for (let i = 0; i < count; i++) wide[i] = bits[base + i] << 16;
    if (out === null) {
      product(scratch.subarray(0, count), rows, y.subarray(r0, r0 + rows));
      continue;
    }
    const o = out.subarray(0, m * rows); // [m, rows]
    product(scratch.subarray(0, count), rows, o);
    for (let i = 0; i < m; i++) y.set(o.subarray(i * rows, (i + 1) * rows), i * n + r0);
  }
}

/** A weight [rows, cols] of a fused product (y = x · Wᵀ): int8/int4 blocks, or float32 values fed at each run. */
export type FusedWeight = (PackedMatrix & { format: QuantFormat }) | { format: 'f32'; rows: number; cols: number };

/**
 * The nodes of y = a · Wᵀ for one weight of a fused graph: MatMulNBits over initializers `${name}.b`/`${name}.scales`
 * for a compact weight, a Gemm over the graph input `name` for a float32 one.
 */
function productNode(w: FusedWeight, name: string, a: string, y: string, initializers: Initializer[]): NodeSpec {
  if (w.format === 'f32') {
    return { op: 'Gemm', inputs: [a, name], outputs: [y], attributes: { transB: 1 } };
  }
  const blocks = blocksPerRow(w.cols);
  initializers.push(
    { name: `${name}.b`, dims: [w.rows, blocks, blobBytes(w.format)], data: w.data as Uint8Array },
    { name: `${name}.scales`, dims: [w.rows * blocks], data: w.scales },
  );
  return {
    op: 'MatMulNBits',
    domain: 'com.microsoft',
    inputs: [a, `${name}.b`, `${name}.scales`],
    outputs: [y],
    attributes: { K: w.cols, N: w.rows, bits: bitsOf(w.format), block_size: QUANT_BLOCK, accuracy_level: ACCURACY_LEVEL },
  };
}

/** A fused graph: input a [M, K], the float32 weights as inputs, outputs [M, n] each. */
function fusedModel(
  nodes: NodeSpec[],
  k: number,
  weightInputs: { name: string; w: FusedWeight }[],
  outputs: { name: string; n: number }[],
  initializers: Initializer[],
): Uint8Array {
  return encodeModel(
    nodes,
    [
      { name: 'a', type: OnnxType.float32, shape: ['m', k] },
      ...weightInputs.map(({ name, w }) => ({ name, type: OnnxType.float32, shape: [w.rows, w.cols] })),
    ],
    outputs.map(({ name, n }) => ({ name, type: OnnxType.float32, shape: ['m', n] })),
    17,
    { initializers, opsets: { 'com.microsoft': 1 } },
  );
}

/**
 * y_i [M, N_i] = a [M, K] · W_iᵀ for weights that share their input (a block's q, k and v projections), in one run:
 * float32 weights are the inputs `w0`, `w1`, … (those that are), compact ones initializers as in matMulNBitsGraph.
 */
export function fusedLinearsGraph(ws: readonly FusedWeight[]): Uint8Array {
  const initializers: Initializer[] = [];
  const nodes = ws.map((w, i) => productNode(w, `w${i}`, 'a', `y${i}`, initializers));
  return fusedModel(nodes, ws[0].cols, ws.flatMap((w, i) => (w.format === 'f32' ? [{ name: `w${i}`, w }] : [])),
    ws.map((w, i) => ({ name: `y${i}`, n: w.rows })), initializers);
}

/** y [M, N] = (silu(a · gateᵀ) ⊙ (a · upᵀ)) · downᵀ, a SwiGLU MLP in one run (weights as in fusedLinearsGraph: w0 gate, w1 up, w2 down). */
export function fusedGatedMlpGraph(gate: FusedWeight, up: FusedWeight, down: FusedWeight): Uint8Array {
  const initializers: Initializer[] = [];
  const nodes = [productNode(gate, 'w0', 'a', 'g', initializers), productNode(up, 'w1', 'a', 'u', initializers)];
  nodes.push(
    { op: 'Sigmoid', inputs: ['g'], outputs: ['gs'] },
    { op: 'Mul', inputs: ['g', 'gs'], outputs: ['silu'] },
    { op: 'Mul', inputs: ['silu', 'u'], outputs: ['h'] },
    productNode(down, 'w2', 'h', 'y', initializers),
  );
  const weights = [gate, up, down].flatMap((w, i) => (w.format === 'f32' ? [{ name: `w${i}`, w }] : []));
  return fusedModel(nodes, gate.cols, weights, [{ name: 'y', n: down.rows }], initializers);
}
