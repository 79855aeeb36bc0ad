import { bitsOf, blobBytes, blocksPerRow, type PackedMatrix, QUANT_BLOCK, type QuantFormat, unpackMatrix } from '../../../quant/formats.ts';
import { Tensor } from '../../../tensor.ts';
import { ACCURACY_LEVEL } from '../../ort/packed.ts';
import { type GraphBuilder, GraphValue, refuse } from '../builder.ts';
import type { LoweringTable } from '../lowerings.ts';
import { broadcast } from './common.ts';

/**
 * Products: matmul, linear and packedLinear, the fused linears and gatedMlp, embedding and packedEmbedding.
 *
 * A float32 weight is the graph value it arrives as (a graph input, fed at each run, so an optimizer's update is
 * seen). A compact weight (Tensor.packed: quant/formats.ts) never changes, so its bytes are stored in the graph:
 * an int8/int4 W [out, in] of y = x · Wᵀ as the `com.microsoft` MatMulNBits' initializers (as the ort backend runs
 * it, ort/packed.ts: activations quantized blockwise, hence the ort tolerance of those formats); bf16, and int8/int4
 * of y = x · W (weightInOut: blocks run along the outputs, which MatMulNBits cannot take) and tables, as the float32
 * matrix the js kernels dequantize (exact: a bf16 value is the upper half of its float32, and (q − zero) · scale
 * has at most 19 significant bits).
 */

/** A weight as a lowering takes it: a float32 graph value, or a compact matrix whose bytes go into the graph. */
type Weight = { value: GraphValue; packed: null } | { value: null; packed: PackedMatrix };

/**
 * The weight `w` stands for. A tensor that is not a graph value came inside an object the trace keeps by reference
 * (a module passed as LinearParams): its bytes may be stored only if it is compact (a float32 one may change).
 */
function weightOf(w: unknown, what: string): Weight {
  if (w instanceof GraphValue) return w.tensor?.packed ? { value: null, packed: w.tensor.packed } : { value: w, packed: null };
  if (w instanceof Tensor && w.packed !== null) return { value: null, packed: w.packed };
  if (w instanceof Tensor) return refuse(`${what} is a float32 tensor that is not a value of the step (held in an object the trace keeps by reference)`);
  return refuse(`${what} is not a tensor`);
}

/** An optional bias as a graph value (null where absent). */
function biasOf(b: unknown): GraphValue | null {
  if (b === null || b === undefined) return null;
  if (b instanceof GraphValue) return b;
  if (b instanceof Tensor) return refuse('a bias that is not a value of the step (held in an object the trace keeps by reference)');
  return refuse('a bias that is not a tensor');
}

function valueOf(v: unknown, what: string): GraphValue {
  return v instanceof GraphValue ? v : refuse(`${what} is not a tensor`);
}

/** Constants made per graph from a compact matrix, so that a matrix read twice (a tied embedding) is stored once. */
const stored = new WeakMap<GraphBuilder, Map<PackedMatrix, Map<string, GraphValue[]>>>();

function once(g: GraphBuilder, p: PackedMatrix, kind: string, make: () => GraphValue[]): GraphValue[] {
  let byMatrix = stored.get(g);
  if (byMatrix === undefined) stored.set(g, (byMatrix = new Map()));
  let byKind = byMatrix.get(p);
  if (byKind === undefined) byMatrix.set(p, (byKind = new Map()));
  let values = byKind.get(kind);
  if (values === undefined) byKind.set(kind, (values = make()));
  return values;
}

/** A compact matrix [rows, cols] as the float32 values the js kernels compute with (quant/formats.ts unpackRow). */
function widened(g: GraphBuilder, p: PackedMatrix): GraphValue {
  return once(g, p, 'f32', () => [g.constant(unpackMatrix(p), [p.rows, p.cols], 'float32')])[0];
}

/** The initializers of MatMulNBits for an int8/int4 matrix: B [N, blocks, blob] of uint8, scales [N · blocks]. */
function nbits(g: GraphBuilder, p: PackedMatrix & { format: QuantFormat }): GraphValue[] {
  const blocks = blocksPerRow(p.cols);
  return once(g, p, 'nbits', () => [
    // the value type is nominal (ValueType has no uint8): the initializer's element type is its array's, uint8
    g.constant(p.data as Uint8Array, [p.rows, blocks, blobBytes(p.format)], 'int32'),
    g.constant(p.scales, [p.rows * blocks], 'float32'),
  ]);
}

const isQuant = (p: PackedMatrix): p is PackedMatrix & { format: QuantFormat } => p.format !== 'bf16';

/** The static shape of numpy's matmul of shapes a and b (1-D operands promoted, then their dim dropped). */
function matmulShape(a: readonly number[], b: readonly number[]): number[] {
  if (a.length === 0 || b.length === 0) return refuse('matmul of a scalar');
  const a2 = a.length === 1 ? [1, a[0]] : a;
  const b2 = b.length === 1 ? [b[0], 1] : b;
  const k = a2[a2.length - 1];
  if (b2[b2.length - 2] !== k) return refuse(`matmul of [${a}] and [${b}]: inner dims ${k} and ${b2[b2.length - 2]}`);
  const out = [...broadcast(a2.slice(0, -2), b2.slice(0, -2)), a2[a2.length - 2], b2[b2.length - 1]];
  if (a.length === 1) out.splice(out.length - 2, 1);
  if (b.length === 1) out.splice(out.length - 1, 1);
  return out;
}

function matmul(g: GraphBuilder, a: unknown, b: unknown): GraphValue {
  const x = valueOf(a, 'matmul\'s left operand');
  const y = valueOf(b, 'matmul\'s right operand');
  if (x.type !== 'float32' || y.type !== 'float32') return refuse(`matmul of ${x.type} and ${y.type}`);
  return g.node('MatMul', [x, y], { shape: matmulShape(x.shape, y.shape), type: 'float32' });
}

/**
 * y = x · Wᵀ + bias (x · W + bias with `weightInOut`), W [rows, cols] as stored, for x [..., in]: the rows of x as
 * one matrix [M, in] through one Gemm (or MatMulNBits), then back to [..., out].
 */
function product(g: GraphBuilder, xIn: unknown, w: Weight, biasIn: unknown, weightInOut: boolean): GraphValue {
  const x = valueOf(xIn, 'linear\'s input');
  const bias = biasOf(biasIn);
  if (x.type !== 'float32') return refuse(`linear of a ${x.type} input`);
  if (x.rank === 0) return refuse('linear of a scalar');
  const [rows, cols] = w.packed !== null ? [w.packed.rows, w.packed.cols] : w.value.shape;
  if (w.value !== null && (w.value.rank !== 2 || w.value.type !== 'float32')) return refuse(`linear by a ${w.value.type} weight [${w.value.shape}]`);
  const [outF, inF] = weightInOut ? [cols, rows] : [rows, cols];
  const k = x.shape[x.rank - 1];
  if (k !== inF) return refuse(`linear: input [${x.shape}] does not fit weight [${rows}, ${cols}]`);
  if (bias !== null && (bias.size !== outF || bias.type !== 'float32')) return refuse(`linear: bias [${bias.shape}] does not fit ${outF} outputs`);
  const m = x.size / k;
  const x2 = g.reshape(x, [m, k]);
  const b = bias === null ? null : g.reshape(bias, [outF]);
  let y: GraphValue;
  if (w.packed !== null && isQuant(w.packed) && !weightInOut) {
    const p = w.packed;
    const attributes = { K: p.cols, N: p.rows, bits: bitsOf(p.format), block_size: QUANT_BLOCK, accuracy_level: ACCURACY_LEVEL };
    y = g.node('MatMulNBits', [x2, ...nbits(g, p)], { shape: [m, outF], type: 'float32' }, attributes, 'com.microsoft');
    if (b !== null) y = g.node('Add', [y, b]);
  } else {
    const wv = w.packed !== null ? widened(g, w.packed) : w.value;
    const inputs = b === null ? [x2, wv] : [x2, wv, b];
    y = g.node('Gemm', inputs, { shape: [m, outF], type: 'float32' }, { transB: weightInOut ? 0 : 1 });
  }
  return g.reshape(y, [...x.shape.slice(0, -1), outF]);
}

function linear(g: GraphBuilder, x: unknown, weight: unknown, bias?: unknown, weightInOut?: unknown): GraphValue {
  return product(g, x, weightOf(weight, 'linear\'s weight'), bias, weightInOut === true);
}

function packedLinear(g: GraphBuilder, x: unknown, weight: unknown, bias?: unknown, weightInOut?: unknown): GraphValue {
  const w = weightOf(weight, 'packedLinear\'s weight');
  if (w.packed === null) return refuse('packedLinear of a weight that is not compact');
  return product(g, x, w, bias, weightInOut === true);
}

/** A layer's weight and bias (LinearParams: a plain object, or a module with those fields). */
function layerOf(l: unknown): { weight: unknown; bias: unknown } {
  if (typeof l !== 'object' || l === null) return refuse('a layer that is not LinearParams');
  const { weight, bias } = l as { weight?: unknown; bias?: unknown };
  return { weight, bias };
}

function linears(g: GraphBuilder, x: unknown, layers: unknown): GraphValue[] {
  if (!Array.isArray(layers)) return refuse('linears of layers that are not an array');
  return layers.map((l: unknown) => {
    const { weight, bias } = layerOf(l);
    return product(g, x, weightOf(weight, 'a layer\'s weight'), bias, false);
  });
}

/** down(silu(gate(x)) ⊙ up(x)), as the js op composes it (each linear with its bias, if any). */
function gatedMlp(g: GraphBuilder, x: unknown, gate: unknown, up: unknown, down: unknown): GraphValue {
  const layer = (l: unknown, input: unknown, name: string) => {
    const { weight, bias } = layerOf(l);
    return product(g, input, weightOf(weight, `${name}'s weight`), bias, false);
  };
  const a = layer(gate, x, 'gate');
  const u = layer(up, x, 'up');
  if (a.shape.length !== u.shape.length || a.shape.some((d, i) => d !== u.shape[i])) {
    return refuse(`gatedMlp: gate [${a.shape}] and up [${u.shape}] differ`);
  }
  const silu = g.node('Mul', [a, g.node('Sigmoid', [a])]);
  return layer(down, g.node('Mul', [silu, u]), 'down');
}

/** Rows of a table [vocab, dim] at int32 ids: a Gather along the table's first dim. */
function rows(g: GraphBuilder, idsIn: unknown, table: GraphValue): GraphValue {
  const ids = valueOf(idsIn, 'embedding\'s ids');
  if (ids.type !== 'int32') return refuse(`embedding ids of ${ids.type}`);
  if (table.rank !== 2) return refuse(`an embedding table of shape [${table.shape}]`);
  return g.node('Gather', [table, ids], { shape: [...ids.shape, table.shape[1]], type: table.type }, { axis: 0 });
}

function embedding(g: GraphBuilder, ids: unknown, weight: unknown): GraphValue {
  const w = weightOf(weight, 'embedding\'s table');
  return rows(g, ids, w.packed !== null ? widened(g, w.packed) : w.value);
}

function packedEmbedding(g: GraphBuilder, ids: unknown, weight: unknown): GraphValue {
  const w = weightOf(weight, 'packedEmbedding\'s table');
  if (w.packed === null) return refuse('packedEmbedding of a table that is not compact');
  return rows(g, ids, widened(g, w.packed));
}

export const PRODUCTS: LoweringTable = {
  matmul,
  linear,
  packedLinear,
  linears,
  gatedMlp,
  embedding,
  packedEmbedding,
};
