import type { FloatArray } from '../dtype.ts';
import type { MatmulSpec } from '../kernels/matmul.ts';
import type { TimeMajorAttentionSpec } from '../ops/attention.ts';
import type { PackedMatrix } from '../quant/formats.ts';

/** A weight [rows, cols] of a fused product (y = x · Wᵀ): float32 `values`, or a compact matrix. */
export interface LinearWeight {
  rows: number;
  cols: number;
  values: Float32Array | null;
  packed: PackedMatrix | null;
}

/**
 * A compute backend: the kernels that are worth handing to something faster than
 * plain TypeScript. Everything else runs on the js kernels for every backend.
 */
export interface Backend {
  readonly name: string;
  /** True when results are bitwise identical on every machine. */
  readonly deterministic: boolean;
  /** out = op(a) op(b) per batch, plus `bias` (length n) on every row when given. */
  matmul(a: FloatArray, b: FloatArray, out: FloatArray, spec: MatmulSpec, bias?: FloatArray): void;
  /**
   * y [m, w.rows] = x [m, w.cols] · Wᵀ for a weight held in a compact format; returns false to leave it to the js
   * kernel (exact: see quant/kernels.ts).
   */
  packedLinear?(x: Float32Array, m: number, w: PackedMatrix, y: Float32Array): boolean;
  /** y = op(x) for a unary op by name; returns false to leave it to the js kernel. */
  unary?(op: string, x: FloatArray, y: FloatArray): boolean;
  /** gx = g · op'(x); returns false to leave it to the js kernel. */
  unaryBackward?(op: string, x: FloatArray, g: FloatArray, gx: FloatArray): boolean;
  /**
   * y = softmax(scale · x) over rows of `tk` in `blocks` of `tq` rows, row i of a block seeing
   * keys 0 … i + tk − tq when `causal` (else all); returns false to leave it to the js kernel.
   */
  softmax?(x: FloatArray, y: FloatArray, blocks: number, tq: number, tk: number, scale: number, causal: boolean): boolean;
  /**
   * Layer norm over rows of n: y, each row's mean and 1/σ (w and b of length n); returns
   * false to leave it to the js kernel.
   */
  layerNorm?(x: FloatArray, w: FloatArray, b: FloatArray, eps: number, y: FloatArray, mean: Float32Array, rstd: Float32Array): boolean;
  /**
   * Causal attention of one sequence: y [H, Tq, D] for q [H, Tq, D] over time-major keys and values [Tk, kvHeads, D]
   * (see attendTimeMajor); returns false to leave it to the js kernel.
   */
  attention?(q: Float32Array, k: Float32Array, v: Float32Array, y: Float32Array, spec: TimeMajorAttentionSpec): boolean;
  /**
   * ys[i] [m, ws[i].rows] = x [m, cols] · ws[i]ᵀ for weights that share their input (a block's q, k, v) in one call;
   * returns false to leave them to `linear`.
   */
  linears?(x: Float32Array, m: number, ws: readonly LinearWeight[], ys: readonly Float32Array[]): boolean;
  /** y [m, down.rows] = (silu(x · gateᵀ) ⊙ (x · upᵀ)) · downᵀ in one call; returns false to leave it to the ops. */
  gatedMlp?(x: Float32Array, m: number, gate: LinearWeight, up: LinearWeight, down: LinearWeight, y: Float32Array): boolean;
}
