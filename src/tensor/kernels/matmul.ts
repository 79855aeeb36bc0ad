import type { FloatArray } from '../dtype.ts';
import { wasmGemm, wasmRuns } from './gemm-wasm.ts';

/**
 * One batched matrix product: for each of `batch` problems,
 * out[m, n] = op(A) @ op(B), where op transposes when the flag is set.
 * A is [m, k] (or [k, m] with transA), B is [k, n] (or [n, k] with transB);
 * an operand that is not batched is shared by every problem.
 */
export interface MatmulSpec {
  batch: number;
  m: number;
  k: number;
  n: number;
  transA: boolean;
  transB: boolean;
  batchedA: boolean;
  batchedB: boolean;
}

/** Columns of B processed per pass, so that a B panel stays in cache. */
const COLUMN_BLOCK = 256;

/**
 * The reference GEMM: C = A @ B for row-major A [m, k] and B [k, n]. Each output is
 * accumulated in double precision over k in increasing order and rounded once, so the
 * result does not depend on the blocking, the machine or the thread count. Rows are
 * processed four at a time so that each loaded element of B is used four times.
 */
export function gemmNN(
  A: FloatArray,
  aOff: number,
  B: FloatArray,
  bOff: number,
  C: FloatArray,
  cOff: number,
  m: number,
  k: number,
  n: number,
): void {
  const acc = new Float64Array(4 * COLUMN_BLOCK);
  for (let j0 = 0; j0 < n; j0 += COLUMN_BLOCK) {
    const jn = Math.min(COLUMN_BLOCK, n - j0);
    for (let i0 = 0; i0 < m; i0 += 4) {
      const rows = Math.min(4, m - i0);
      acc.fill(0);
      if (rows === 4) {
        const r0 = aOff + i0 * k;
        const r1 = r0 + k;
        const r2 = r1 + k;
        const r3 = r2 + k;
        for (let p = 0; p < k; p++) {
          const a0 = A[r0 + p];
          const a1 = A[r1 + p];
          const a2 = A[r2 + p];
          const a3 = A[r3 + p];
          const bRow = bOff + p * n + j0;
          for (let j = 0; j < jn; j++) {
            const b = B[bRow + j];
            acc[j] += a0 * b;
            acc[COLUMN_BLOCK + j] += a1 * b;
            acc[2 * COLUMN_BLOCK + j] += a2 * b;
            acc[3 * COLUMN_BLOCK + j] += a3 * b;
          }
        }
      } else {
        for (let r = 0; r < rows; r++) {
          const row = aOff + (i0 + r) * k;
          const base = r * COLUMN_BLOCK;
          for (let p = 0; p < k; p++) {
            const a = A[row + p];
            const bRow = bOff + p * n + j0;
            for (let j = 0; j < jn; j++) acc[base + j] += a * B[bRow + j];
          }
        }
      }
      for (let r = 0; r < rows; r++) {
        const o = cOff + (i0 + r) * n + j0;
        const base = r * COLUMN_BLOCK;
        for (let j = 0; j < jn; j++) C[o + j] = acc[base + j];
      }
    }
  }
}

/** Transposes one [rows, cols] matrix at `off` into a new contiguous [cols, rows] array. */
export function transposed(src: FloatArray, off: number, rows: number, cols: number): FloatArray {
  const out = src instanceof Float64Array ? new Float64Array(rows * cols) : new Float32Array(rows * cols);
  const TILE = 32;
  for (let i0 = 0; i0 < rows; i0 += TILE) {
    for (let j0 = 0; j0 < cols; j0 += TILE) {
      const iEnd = Math.min(i0 + TILE, rows);
      const jEnd = Math.min(j0 + TILE, cols);
      for (let i = i0; i < iEnd; i++)
        for (let j = j0; j < jEnd; j++) out[j * rows + i] = src[off + i * cols + j];
    }
  }
  return out;
}

/** Rows of A up to which A @ Bᵀ reads B's rows in place (gemmNT) instead of transposing B first. */
const NT_MAX_ROWS = 8;

/**
 * C = A @ Bᵀ for row-major A [m, k] and B [n, k], each output the dot product of two rows accumulated in double
 * precision over k in increasing order and rounded once: gemmNN's sums exactly, without the transposed copy of B
 * that costs more than the product when A has a row or two (decoding: y = x · Wᵀ reads every weight once).
 */
export function gemmNT(
  A: FloatArray,
  aOff: number,
  B: FloatArray,
  bOff: number,
  C: FloatArray,
  cOff: number,
  m: number,
  k: number,
  n: number,
): void {
  for (let j = 0; j < n; j++) {
    const bRow = bOff + j * k;
    for (let i = 0; i < m; i++) {
      const aRow = aOff + i * k;
      let acc = 0;
      for (let p = 0; p < k; p++) acc += A[aRow + p] * B[bRow + p];
      C[cOff + i * n + j] = acc;
    }
  }
}

/** gemmNN's signature: another implementation of the same sums (the WebAssembly kernel) may stand in for it. */
export type GemmNN = typeof gemmNN;

/**
 * The GEMM the js backend runs: gemm.wat's (gemm-wasm.ts) where WebAssembly SIMD runs, gemmNN elsewhere. Both give
 * the same bits, so the choice shows only in the time.
 */
export const fastGemm: GemmNN = wasmRuns() ? wasmGemm(gemmNN) : gemmNN;

/**
 * Batched matrix product, bitwise reproducible: `nn` (by default `fastGemm`) computes each product of untransposed
 * operands, gemmNT a few rows against a transposed B.
 */
export function matmulJs(A: FloatArray, B: FloatArray, C: FloatArray, s: MatmulSpec, nn: GemmNN = fastGemm): void {
  const { m, k, n } = s;
  let sharedB: FloatArray | null = null;
  for (let p = 0; p < s.batch; p++) {
    const aOff = s.batchedA ? p * m * k : 0;
    const bOff = s.batchedB ? p * k * n : 0;
    if (s.transB && !s.transA && m <= NT_MAX_ROWS) {
      gemmNT(A, aOff, B, bOff, C, p * m * n, m, k, n);
      continue;
    }
    const a = s.transA ? transposed(A, aOff, k, m) : A;
    let b: FloatArray = B;
    if (s.transB) {
      if (s.batchedB || sharedB === null) b = transposed(B, bOff, n, k);
      else b = sharedB;
      if (!s.batchedB) sharedB = b;
    }
    nn(a, s.transA ? 0 : aOff, b, s.transB ? 0 : bOff, C, p * m * n, m, k, n);
  }
}

/** out[r, :] += bias for every row of a row-major [rows, bias.length] buffer. */
export function addRowBias(out: FloatArray, bias: FloatArray): void {
  const n = bias.length;
  for (let r = 0; r < out.length; r += n) for (let j = 0; j < n; j++) out[r + j] += bias[j];
}
