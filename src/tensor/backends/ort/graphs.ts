import { encodeModel, type NodeSpec, OnnxType } from './onnx-graph.ts';

/**
 * The small ONNX graphs the ort backend runs: matrix products and the transcendental
 * elementwise ops, whose V8 implementations cost 10–25 ns per element while
 * onnxruntime's vectorised kernels cost well under 1 ns (measured: bench/run.ts).
 */

const vec = (name: string) => ({ name, type: OnnxType.float32, shape: ['n'] });
const mat = (name: string, dims: string[]) => ({ name, type: OnnxType.float32, shape: dims });

/** c = op(a) op(b) (+ bias broadcast over rows when `withBias`). */
export function gemmGraph(transA: boolean, transB: boolean, withBias = false): Uint8Array {
  const node: NodeSpec = {
    op: 'Gemm',
    inputs: withBias ? ['a', 'b', 'bias'] : ['a', 'b'],
    outputs: ['c'],
    attributes: { transA: transA ? 1 : 0, transB: transB ? 1 : 0 },
  };
  const inputs = [mat('a', ['r0', 'c0']), mat('b', ['r1', 'c1'])];
  if (withBias) inputs.push(vec('bias'));
  return encodeModel([node], inputs, [mat('c', ['m', 'n'])]);
}

export function batchedMatmulGraph(transA: boolean, transB: boolean): Uint8Array {
  const nodes: NodeSpec[] = [];
  let a = 'a';
  let b = 'b';
  if (transA) {
    nodes.push({ op: 'Transpose', inputs: ['a'], outputs: ['at'], attributes: { perm: [0, 2, 1] } });
    a = 'at';
  }
  if (transB) {
    nodes.push({ op: 'Transpose', inputs: ['b'], outputs: ['bt'], attributes: { perm: [0, 2, 1] } });
    b = 'bt';
  }
  nodes.push({ op: 'MatMul', inputs: [a, b], outputs: ['c'] });
  return encodeModel(
    nodes,
    [mat('a', ['ba', 'r0', 'c0']), mat('b', ['bb', 'r1', 'c1'])],
    [mat('c', ['bc', 'm', 'n'])],
  );
}

const SQRT_2_OVER_PI = Math.sqrt(2 / Math.PI);
const GELU_C = 0.044715;

/** A tiny graph-building helper: named nodes, float constants. */
class Builder {
  readonly nodes: NodeSpec[] = [];
  private count = 0;

  op(op: string, inputs: string[], attributes?: NodeSpec['attributes']): string {
    const out = `t${this.count++}`;
    this.nodes.push({ op, inputs, outputs: [out], attributes });
    return out;
  }

  constant(value: number): string {
    return this.op('Constant', [], { value_float: { float: value } });
  }

  /** Renames the last node's output. */
  output(name: string): void {
    this.nodes[this.nodes.length - 1].outputs = [name];
  }
}

export type OrtUnary = 'exp' | 'log' | 'tanh' | 'sigmoid' | 'silu' | 'gelu';
export type OrtUnaryBackward = 'silu' | 'gelu';

export const ORT_UNARY: ReadonlySet<string> = new Set<OrtUnary>([
  'exp',
  'log',
  'tanh',
  'sigmoid',
  'silu',
  'gelu',
]);
export const ORT_UNARY_BACKWARD: ReadonlySet<string> = new Set<OrtUnaryBackward>(['silu', 'gelu']);

/** y = op(x) over a flat vector. */
export function unaryGraph(op: OrtUnary): Uint8Array {
  const b = new Builder();
  switch (op) {
    case 'exp':
      b.op('Exp', ['x']);
      break;
    case 'log':
      b.op('Log', ['x']);
      break;
    case 'tanh':
      b.op('Tanh', ['x']);
      break;
    case 'sigmoid':
      b.op('Sigmoid', ['x']);
      break;
    case 'silu':
      b.op('Mul', ['x', b.op('Sigmoid', ['x'])]);
      break;
    case 'gelu':
      b.op('Gelu', ['x'], { approximate: 'tanh' });
      break;
  }
  b.output('y');
  return encodeModel(b.nodes, [vec('x')], [vec('y')], 20);
}

/** gx = g · op'(x) over flat vectors. */
export function unaryBackwardGraph(op: OrtUnaryBackward): Uint8Array {
  const b = new Builder();
  if (op === 'silu') {
    // s (1 + x (1 − s))
    const s = b.op('Sigmoid', ['x']);
    const oneMinus = b.op('Sub', [b.constant(1), s]);
    const inner = b.op('Add', [b.constant(1), b.op('Mul', ['x', oneMinus])]);
    b.op('Mul', ['g', b.op('Mul', [s, inner])]);
  } else {
    // t = tanh(c (x + k x³)); 0.5 (1 + t) + 0.5 x (1 − t²) c (1 + 3k x²)
    const x2 = b.op('Mul', ['x', 'x']);
    const x3 = b.op('Mul', [x2, 'x']);
    const u = b.op('Mul', [
      b.constant(SQRT_2_OVER_PI),
      b.op('Add', ['x', b.op('Mul', [b.constant(GELU_C), x3])]),
    ]);
    const t = b.op('Tanh', [u]);
    const half = b.constant(0.5);
    const left = b.op('Mul', [half, b.op('Add', [b.constant(1), t])]);
    const sech2 = b.op('Sub', [b.constant(1), b.op('Mul', [t, t])]);
    const du = b.op('Mul', [
      b.constant(SQRT_2_OVER_PI),
      b.op('Add', [b.constant(1), b.op('Mul', [b.constant(3 * GELU_C), x2])]),
    ]);
    const right = b.op('Mul', [b.op('Mul', [half, 'x']), b.op('Mul', [sech2, du])]);
    b.op('Mul', ['g', b.op('Add', [left, right])]);
  }
  b.output('gx');
  return encodeModel(b.nodes, [vec('x'), vec('g')], [vec('gx')], 20);
}

/**
 * y = softmax(s · x + mask) over the last axis: x is [blocks, tq, tk], s a 1-element
 * scale and mask an additive [tq, tk] (0 where a query may attend, −∞ elsewhere).
 */
export function maskedSoftmaxGraph(): Uint8Array {
  const b = new Builder();
  b.op('Softmax', [b.op('Add', [b.op('Mul', ['x', 's']), 'mask'])], { axis: -1 });
  b.output('y');
  const x = mat('x', ['r', 'q', 'k']);
  return encodeModel(b.nodes, [x, { name: 's', type: OnnxType.float32, shape: [1] }, mat('mask', ['q', 'k'])], [mat('y', ['r', 'q', 'k'])]);
}

/** LayerNormalization over the last axis of x [rows, n]: y, and each row's mean and 1/σ. */
export function layerNormGraph(eps: number): Uint8Array {
  const node: NodeSpec = {
    op: 'LayerNormalization',
    inputs: ['x', 'w', 'b'],
    outputs: ['y', 'mean', 'rstd'],
    attributes: { axis: -1, epsilon: { float: eps } },
  };
  return encodeModel(
    [node],
    [mat('x', ['rows', 'n']), vec('w'), vec('b')],
    [mat('y', ['rows', 'n']), mat('mean', ['rows', 'one']), mat('rstd', ['rows', 'one'])],
  );
}

/**
 * Causal attention of one sequence over time-major keys and values in one call: q [kvHeads, rows, D] (the query
 * heads that share a key head, their Tq rows each, one after another), k and v [Tk, kvHeads, D], s a 1-element scale
 * and mask an additive [rows, Tk]: y [kvHeads, rows, D] = softmax(s · q kᵀ + mask) v for each key head. Without
 * `masked` there is no mask (one query, the last position, sees every key).
 */
export function timeMajorAttentionGraph(masked = true): Uint8Array {
  const b = new Builder();
  const scores = b.op('Mul', [b.op('MatMul', ['q', b.op('Transpose', ['k'], { perm: [1, 2, 0] })]), 's']); // [kvHeads, rows, Tk]
  const p = b.op('Softmax', [masked ? b.op('Add', [scores, 'mask']) : scores], { axis: -1 });
  b.op('MatMul', [p, b.op('Transpose', ['v'], { perm: [1, 0, 2] })]); // [kvHeads, rows, D]
  b.output('y');
  const inputs = [mat('q', ['h', 'r', 'd']), mat('k', ['t', 'h', 'd']), mat('v', ['t', 'h', 'd']), { name: 's', type: OnnxType.float32, shape: [1] }];
  if (masked) inputs.push(mat('mask', ['r', 't']));
  return encodeModel(b.nodes, inputs, [mat('y', ['h', 'r', 'd'])]);
}
