import { blocksPerRow, type PackedMatrix, QUANT_BLOCK, unpackRow } from './formats.ts';

/**
 * The js kernels of the compact formats. Each weight is unpacked to its float32 value (exact: see formats.ts) and
 * every output is accumulated in double precision over k in increasing order and rounded once, as the dense js GEMM
 * does: so a product with a packed matrix equals, bit for bit on any machine, the dense product with the matrix
 * unpacked. That is what lets a validator re-execute a compact section exactly.
 */

/** A buffer for one unpacked row (int formats unpack whole blocks). */
function rowBuffer(p: PackedMatrix): Float32Array {
  return new Float32Array(p.format === 'bf16' ? p.cols : blocksPerRow(p.cols) * QUANT_BLOCK);
}

/** y [m, rows] = x [m, cols] · Wᵀ for W = p [rows, cols] (nn.Linear's product). */
export function packedLinearJs(x: Float32Array, m: number, p: PackedMatrix, y: Float32Array): void {
  const { rows: n, cols: k } = p;
  const w = rowBuffer(p);
  for (let j = 0; j < n; j++) {
    unpackRow(p, j, w);
    for (let i = 0; i < m; i++) {
      const off = i * k;
      let acc = 0;
      for (let t = 0; t < k; t++) acc += x[off + t] * w[t];
      y[i * n + j] = acc;
    }
  }
}

/** dx [m, cols] = g [m, rows] · W for W = p [rows, cols] (the input's gradient through nn.Linear's product). */
export function packedLinearInputGradJs(g: Float32Array, m: number, p: PackedMatrix, dx: Float32Array): void {
  const { rows: n, cols: k } = p;
  const w = rowBuffer(p);
  const acc = new Float64Array(m * k);
  for (let j = 0; j < n; j++) {
    unpackRow(p, j, w);
    for (let i = 0; i < m; i++) {
      const gij = g[i * n + j];
      const off = i * k;
      for (let t = 0; t < k; t++) acc[off + t] += gij * w[t];
    }
  }
  dx.set(acc);
}

/** y [m, cols] = x [m, rows] · W for W = p [rows, cols] stored [in, out] (GPT-2's Conv1D). */
export const packedInOutLinearJs = packedLinearInputGradJs;

/** dx [m, rows] = g [m, cols] · Wᵀ for W = p [rows, cols] stored [in, out]. */
export const packedInOutInputGradJs = packedLinearJs;

/** out [ids.length, cols] = the rows of W at `ids` (an embedding lookup); ids are checked by the caller. */
export function packedRowsJs(p: PackedMatrix, ids: ArrayLike<number>, out: Float32Array): void {
  const w = rowBuffer(p);
  for (let i = 0; i < ids.length; i++) {
    unpackRow(p, ids[i], w);
    out.set(w.subarray(0, p.cols), i * p.cols);
  }
}
