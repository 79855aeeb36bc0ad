import { DTypeError, ShapeMismatchError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { getBackend } from '../backends/select.ts';
import { allocate, assertFloat, type FloatArray } from '../dtype.ts';
import { broadcastShapes, sizeOf } from '../shape.ts';
import { sumRowsInto } from '../kernels/rows.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';
import { packedLinear } from './packed.ts';
import { sumTo } from './reduce.ts';
import { expand, reshape } from './shape.ts';

/**
 * Matrix products. `core` multiplies two 3-D operands ([batch or 1, rows, cols]) with
 * optional transposes through the selected backend; `matmul` and `linear` reduce to it
 * and express their vector-Jacobian products as further `core` calls.
 */

function core(a: Tensor, b: Tensor, transA: boolean, transB: boolean, bias?: Tensor | null): Tensor {
  const [ba, ra, ca] = a.shape;
  const [bb, rb, cb] = b.shape;
  const m = transA ? ca : ra;
  const k = transA ? ra : ca;
  const kb = transB ? cb : rb;
  const n = transB ? rb : cb;
  if (k !== kb) throw new ShapeMismatchError(`matmul inner dims differ: ${k} and ${kb}`);
  const batch = Math.max(ba, bb);
  const out = allocate(a.dtype, batch * m * n) as FloatArray;
  getBackend().matmul(a.data as FloatArray, b.data as FloatArray, out, {
    batch,
    m,
    k,
    n,
    transA,
    transB,
    batchedA: ba > 1 || batch === 1,
    batchedB: bb > 1 || batch === 1,
  }, bias ? (bias.data as FloatArray) : undefined);
  return new Tensor(out, [batch, m, n]);
}

/** Gradients of C = op(A) op(B) for 3-D operands, reduced to each operand's batch. */
function coreVjp(a: Tensor, b: Tensor, transA: boolean, transB: boolean, g: Tensor): [Tensor, Tensor] {
  let da: Tensor;
  let db: Tensor;
  if (!transA && !transB) {
    da = core(g, b, false, true);
    db = core(a, g, true, false);
  } else if (!transA && transB) {
    da = core(g, b, false, false);
    db = core(g, a, true, false);
  } else if (transA && !transB) {
    da = core(b, g, false, true);
    db = core(a, g, false, false);
  } else {
    da = core(b, g, true, true);
    db = core(g, a, true, true);
  }
  return [sumTo(da, a.shape), sumTo(db, b.shape)];
}

function checkFloat(a: Tensor, b: Tensor): void {
  assertFloat(a.dtype, 'matmul');
  if (a.dtype !== b.dtype) throw new DTypeError(`matmul of ${a.dtype} and ${b.dtype}`);
}

/**
 * Matrix product with NumPy semantics: 1-D operands are promoted, leading (batch) dims
 * broadcast. A 2-D right operand folds the left operand's batch into its rows.
 * @example
 * const y = x.matmul(w)   // [B, T, k] @ [k, n] → [B, T, n]
 */
export function matmul(aIn: Tensor, bIn: Tensor): Tensor {
  if (hooked) return hook('matmul', matmul, [aIn, bIn]);
  checkFloat(aIn, bIn);
  const a = aIn.ndim === 1 ? reshape(aIn, [1, aIn.size]) : aIn;
  const b = bIn.ndim === 1 ? reshape(bIn, [bIn.size, 1]) : bIn;
  const m = a.shape[a.ndim - 2];
  const k = a.shape[a.ndim - 1];
  const n = b.shape[b.ndim - 1];
  if (b.shape[b.ndim - 2] !== k) {
    throw new ShapeMismatchError(
      `matmul of [${aIn.shape}] and [${bIn.shape}]: inner dims ${k} and ${b.shape[b.ndim - 2]}`,
    );
  }
  let outShape: number[];
  let a3: Tensor;
  let b3: Tensor;
  if (b.ndim === 2) {
    const batchShape = a.shape.slice(0, -2);
    a3 = reshape(a, [1, sizeOf(batchShape) * m, k]);
    b3 = reshape(b, [1, k, n]);
    outShape = [...batchShape, m, n];
  } else {
    const batchShape = broadcastShapes(a.shape.slice(0, -2), b.shape.slice(0, -2));
    const batch = sizeOf(batchShape);
    const fit = (t: Tensor, rows: number, cols: number) => {
      const own = sizeOf(t.shape.slice(0, -2));
      if (own === batch || own === 1) return reshape(t, [own, rows, cols]);
      return reshape(expand(t, [...batchShape, rows, cols]), [batch, rows, cols]);
    };
    a3 = fit(a, m, k);
    b3 = fit(b, k, n);
    outShape = [...batchShape, m, n];
  }
  const c = matmul3(a3, b3);
  if (aIn.ndim === 1) outShape.splice(outShape.length - 2, 1);
  if (bIn.ndim === 1) outShape.splice(outShape.length - 1, 1);
  return reshape(c, outShape);
}

function matmul3(a: Tensor, b: Tensor): Tensor {
  const out = core(a, b, false, false);
  return record(out, 'matmul', [a, b], (g) => coreVjp(a, b, false, false, g));
}

/**
 * y = x @ weightᵀ + bias, with weight stored [out, in] as PyTorch's nn.Linear; with
 * `weightInOut` the weight is stored [in, out] (GPT-2's Conv1D) and y = x @ weight + bias.
 * @example
 * const y = linear(x, w, b)   // [B, T, in] → [B, T, out]
 */
export function linear(x: Tensor, weight: Tensor, bias?: Tensor | null, weightInOut = false): Tensor {
  if (hooked) return hook('linear', linear, [x, weight, bias, weightInOut]);
  if (weight.packed !== null) return packedLinear(x, weight, bias, weightInOut);
  checkFloat(x, weight);
  const [outF, inF] = weightInOut ? [weight.shape[1], weight.shape[0]] : weight.shape;
  if (weight.ndim !== 2 || x.shape[x.ndim - 1] !== inF) {
    throw new ShapeMismatchError(`linear: input [${x.shape}] does not fit weight [${weight.shape}]`);
  }
  if (bias && bias.size !== outF) throw new ShapeMismatchError(`linear: bias [${bias.shape}] does not fit ${outF} outputs`);
  const rows = x.size / inF;
  const x3 = new Tensor(x.data, [1, rows, inF]);
  const w3 = new Tensor(weight.data, [1, weight.shape[0], weight.shape[1]]);
  const y = core(x3, w3, false, !weightInOut, bias);
  const out = new Tensor(y.data, [...x.shape.slice(0, -1), outF]);
  const inputs = bias ? [x, weight, bias] : [x, weight];
  return record(out, 'linear', inputs, (g) => {
    const g3 = new Tensor(g.data, [1, rows, outF]);
    const dx = x.requiresGrad ? new Tensor(core(g3, w3, false, weightInOut).data, x.shape) : null;
    let dw: Tensor | null = null;
    if (weight.requiresGrad) {
      dw = new Tensor((weightInOut ? core(x3, g3, true, false) : core(g3, x3, true, false)).data, weight.shape);
    }
    let db: Tensor | null = null;
    if (bias?.requiresGrad) {
      const acc = new Float64Array(outF);
      const gd = g.data;
      sumRowsInto(acc, gd, rows, outF);
      db = new Tensor(allocate(bias.dtype, outF), bias.shape);
      db.data.set(acc);
    }
    return [dx, dw, db];
  });
}
