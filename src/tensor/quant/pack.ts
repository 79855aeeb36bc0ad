import { InvalidArgumentError } from '../../errors.ts';
import { Tensor } from '../tensor.ts';
import type { PackedMatrix } from './formats.ts';
import { emptyPacked, packMatrix, packRows, type WeightFormat } from './formats.ts';

/**
 * Holds a 2-D float32 weight in `format` from now on, in place: its values are packed (its rows the first dim, as
 * stored: nn.Linear's [out, in], or GPT-2's Conv1D [in, out], which `linear` is told), its float32 buffer is let go,
 * and it is frozen (no gradient: a compact weight is not trained; adapters on top of it are). Every module and
 * tied head that holds the tensor now computes with the compact weight.
 * @param values the float32 values to pack (default: the tensor's own), e.g. a checkpoint's tensor read one at a time
 * while the tensor's buffer was never written, so that the whole model never sits in float32
 */
export function packWeight(t: Tensor, format: WeightFormat, values: ArrayLike<number> = t.data): void {
  checkPackable(t, format);
  hold(t, packMatrix(values, t.shape[0], t.shape[1], format));
}

/**
 * packWeight from values read a few rows at a time (`read(start, count)`: elements [start, start + count) of the
 * row-major matrix), so that not even one whole weight sits in float32: a checkpoint's embedding is often the largest.
 */
export function packWeightRows(
  t: Tensor, format: WeightFormat, read: (start: number, count: number) => ArrayLike<number>, rowsPerRead = 256,
): void {
  checkPackable(t, format);
  const [rows, cols] = t.shape;
  const packed = emptyPacked(rows, cols, format);
  for (let r = 0; r < rows; r += rowsPerRead) {
    const n = Math.min(rowsPerRead, rows - r);
    packRows(packed, r, read(r * cols, n * cols));
  }
  hold(t, packed);
}

/** Holds `t` as the packed matrix `p` as it is (GGUF's Q8_0/Q4_0 blocks are our int8/int4): its rows the tensor's first dim. */
export function holdPacked(t: Tensor, p: PackedMatrix): void {
  checkPackable(t, p.format);
  if (p.rows !== t.shape[0] || p.cols !== t.shape[1]) throw new InvalidArgumentError(`a [${p.rows}, ${p.cols}] ${p.format} matrix cannot hold a [${t.shape}] weight`);
  hold(t, p);
}

function checkPackable(t: Tensor, format: WeightFormat): void {
  if (t.ndim !== 2) throw new InvalidArgumentError(`only a matrix can be held in ${format}: this tensor is [${t.shape}]`);
  if (t.dtype !== 'float32') throw new InvalidArgumentError(`only a float32 matrix can be held in ${format}, not ${t.dtype}`);
  if (t.packed !== null) throw new InvalidArgumentError(`this [${t.shape}] weight is already held in ${t.packed.format}`);
}

function hold(t: Tensor, packed: PackedMatrix): void {
  if (t.requiresGrad) t.requiresGrad = false;
  t.grad = null;
  t.data = new Float32Array(0);
  t.packed = packed;
}

/** A frozen [rows, cols] weight held as `p` (a weight that arrived packed): its float32 buffer is never written. */
export function packedTensor(p: PackedMatrix): Tensor {
  const t = new Tensor(new Float32Array(p.rows * p.cols), [p.rows, p.cols]);
  hold(t, p);
  return t;
}
