import type { FloatArray } from '../dtype.ts';

/**
 * Loops of the backward passes as top-level functions. A backward is a closure made anew for each op a forward records;
 * a hot loop inside it was seen to fall into deoptimization loops in V8 (in a 300-step demo, 39 deoptimizations of a
 * bias's gradient loop in one worker and 32 of layer norm's backward in another; in other runs a worker whose backward
 * ran unoptimized, with boxed doubles, spent 14× the garbage collection of its neighbour). A function of its own is
 * optimized once for all the closures that call it. Each computes what the loop it replaced computed, in the same
 * order: the same bits.
 */

/** acc[j] += Σ_r g[r · cols + j], the rows added in order: a bias's gradient. */
export function sumRowsInto(acc: Float64Array, g: ArrayLike<number>, rows: number, cols: number): void {
  for (let r = 0; r < rows; r++) for (let j = 0; j < cols; j++) acc[j] += g[r * cols + j];
}

/** d[k] += s[k] for every k: a gradient added into another in place. */
export function addInto(d: FloatArray, s: ArrayLike<number>): void {
  for (let k = 0; k < d.length; k++) d[k] += s[k];
}

/**
 * Layer norm's backward over `rows` rows of `n`: gx, and gw / gb (float64 sums) added into. x̂ is recomputed from the
 * input, its mean and 1/σ.
 */
export function layerNormBackwardRows(
  src: ArrayLike<number>, gd: ArrayLike<number>, w: ArrayLike<number> | undefined, means: Float64Array, rstd: Float64Array,
  gx: FloatArray, gw: Float64Array, gb: Float64Array, rows: number, n: number,
): void {
  for (let r = 0; r < rows; r++) {
    const base = r * n;
    const mean = means[r];
    const rs = rstd[r];
    let sumG = 0;
    let sumGH = 0;
    for (let j = 0; j < n; j++) {
      const h = (src[base + j] - mean) * rs; // x̂, recomputed instead of stored
      const gh = gd[base + j] * (w ? w[j] : 1);
      sumG += gh;
      sumGH += gh * h;
      gw[j] += gd[base + j] * h;
      gb[j] += gd[base + j];
    }
    for (let j = 0; j < n; j++) {
      const h = (src[base + j] - mean) * rs;
      const gh = gd[base + j] * (w ? w[j] : 1);
      gx[base + j] = (rs / n) * (n * gh - sumG - h * sumGH);
    }
  }
}

/** RMS norm's backward over `rows` rows of `n`: gx, and gw (float64 sums) added into. */
export function rmsNormBackwardRows(
  src: ArrayLike<number>, gd: ArrayLike<number>, w: ArrayLike<number> | undefined, rstd: Float64Array,
  gx: FloatArray, gw: Float64Array, rows: number, n: number,
): void {
  for (let r = 0; r < rows; r++) {
    const base = r * n;
    const rs = rstd[r];
    let dot = 0;
    for (let j = 0; j < n; j++) {
      const gh = gd[base + j] * (w ? w[j] : 1);
      dot += gh * src[base + j];
      gw[j] += gd[base + j] * src[base + j] * rs;
    }
    const c = (rs * rs * rs * dot) / n;
    for (let j = 0; j < n; j++) {
      const gh = gd[base + j] * (w ? w[j] : 1);
      gx[base + j] = gh * rs - src[base + j] * c;
    }
  }
}
