import { InvalidArgumentError, ShapeMismatchError } from '../../errors.ts';
import { noGrad, record } from '../autograd.ts';
import { getBackend } from '../backends/select.ts';
import {
  packedInOutInputGradJs,
  packedInOutLinearJs,
  packedLinearInputGradJs,
  packedLinearJs,
  packedRowsJs,
} from '../quant/kernels.ts';
import { unpackMatrix } from '../quant/formats.ts';
import { matmul } from './matmul.ts';
import { sumRowsInto } from '../kernels/rows.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';

/**
 * linear and embedding with a weight held in a compact format (Tensor.packed): the weight is frozen, so gradients
 * flow to the input and the bias only. js computes with its exact kernels (quant/kernels.ts); a backend may take the
 * product (`packedLinear`: onnxruntime's MatMulNBits).
 */

/** y = x · Wᵀ + b (or x · W + b with `weightInOut`) for a packed W. */
export function packedLinear(x: Tensor, weight: Tensor, bias: Tensor | null | undefined, weightInOut: boolean): Tensor {
  if (hooked) return hook('packedLinear', packedLinear, [x, weight, bias, weightInOut]);
  const p = weight.packed!;
  if (x.dtype !== 'float32') throw new InvalidArgumentError(`a compact weight multiplies float32 inputs, not ${x.dtype}`);
  const [inF, outF] = weightInOut ? [p.rows, p.cols] : [p.cols, p.rows];
  if (x.shape[x.ndim - 1] !== inF) throw new ShapeMismatchError(`linear: input [${x.shape}] does not fit weight [${weight.shape}]`);
  if (bias && bias.size !== outF) throw new ShapeMismatchError(`linear: bias [${bias.shape}] does not fit ${outF} outputs`);
  const rows = x.size / inF;
  const xd = x.data as Float32Array;
  const y = new Float32Array(rows * outF);
  if (weightInOut) packedInOutLinearJs(xd, rows, p, y);
  else if (!getBackend().packedLinear?.(xd, rows, p, y)) packedLinearJs(xd, rows, p, y);
  if (bias) {
    const b = bias.data;
    for (let r = 0; r < y.length; r += outF) for (let j = 0; j < outF; j++) y[r + j] += b[j];
  }
  const out = new Tensor(y, [...x.shape.slice(0, -1), outF]);
  const inputs = bias ? [x, bias] : [x];
  return record(out, 'linear', inputs, (g) => {
    let dx: Tensor | null = null;
    if (x.requiresGrad) {
      if (getBackend().packedLinear) {
        // a backend with its own products (onnxruntime): the weight unpacked for this product only, then its dense gemm
        // (as QLoRA dequantizes a block's weights for its backward); js keeps its exact kernel
        const w = new Tensor(unpackMatrix(p), [p.rows, p.cols]);
        const g2 = new Tensor(g.data as Float32Array, [rows, outF]);
        dx = noGrad(() => matmul(g2, weightInOut ? w.transpose(0, 1) : w)).reshape(x.shape);
      } else {
        const d = new Float32Array(rows * inF);
        (weightInOut ? packedInOutInputGradJs : packedLinearInputGradJs)(g.data as Float32Array, rows, p, d);
        dx = new Tensor(d, x.shape);
      }
    }
    let db: Tensor | null = null;
    if (bias?.requiresGrad) {
      const acc = new Float64Array(outF);
      const gd = g.data;
      sumRowsInto(acc, gd, rows, outF);
      db = new Tensor(Float32Array.from(acc), bias.shape);
    }
    return bias ? [dx, db] : [dx];
  });
}

/** The rows of a packed table at `ids` (int32, checked against the vocabulary). */
export function packedEmbedding(ids: Tensor, weight: Tensor): Tensor {
  if (hooked) return hook('packedEmbedding', packedEmbedding, [ids, weight]);
  const p = weight.packed!;
  for (let i = 0; i < ids.size; i++) {
    const id = ids.data[i];
    if (id < 0 || id >= p.rows) throw new InvalidArgumentError(`token id ${id} is outside the vocabulary of ${p.rows}`);
  }
  const out = new Float32Array(ids.size * p.cols);
  packedRowsJs(p, ids.data, out);
  return new Tensor(out, [...ids.shape, p.cols]);
}
