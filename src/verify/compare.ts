/**
 * Output comparison for proof-of-learning verification: a verifier re-executes a record and
 * compares what it gets with what the worker claimed. On the js backend the engine is bitwise
 * reproducible, so the results must be the same bytes; on onnxruntime ("ort") the order in which
 * sums are accumulated depends on the kernel, the CPU and the thread count, so results agree
 * when they lie within a calibrated relative distance (ORT_TOLERANCE).
 */

import { InvalidArgumentError } from '../errors.ts';

/** The backend a result was computed on (the tensor layer's backend names). */
export type ComputeBackend = 'js' | 'ort';

/**
 * The largest relative L2 distance ‖a − b‖₂ / ‖a‖₂ (see `drift`) at which two ort results of
 * the same computation agree: 3e-5.
 *
 * Derivation. float32 rounds with unit roundoff u = 2⁻²⁴ ≈ 6.0e-8. A dot product of length n
 * summed in two different orders (another thread split, another CPU's kernel) differs by at
 * most γₙ = n·u / (1 − n·u) ≈ n·u relative to Σ|aᵢbᵢ|: the worst-case forward error of a sum,
 * ≈ 1.8e-4 at n = 3072 (GPT-2's MLP). That bound needs every rounding error to line up; they
 * are independent with zero mean, so in practice they grow like √n·u: ≈ 3.3e-6 at n = 3072,
 * ≈ 6.3e-6 at n = 11008 (Llama-7B's MLP), and what is measured is smaller still.
 *
 * Measured (bench/ort-drift.ts; AMD EPYC, AVX-512; sections of 2 blocks (one of 4, one of the
 * final norm and head), GPT-2 and Llama, hidden 32 … 768, 32 … 128 tokens; forward output,
 * input gradient, and each parameter gradient as its own tensor; max over inputs):
 *   - ort at 1 vs 2 intra-op threads: ≤ 3.6e-7 (4.5e-7 over the 1,000 computations of
 *     test/verify/compare.test.ts); 0 where every product stays below the size that splits.
 *   - ort vs the js kernels (another accumulation order, as another CPU's kernels give):
 *     forward ≤ 2.2e-7, input gradient ≤ 2.4e-7, parameter gradients ≤ 5.5e-7 at the initial
 *     weight scale; ≤ 1.5e-6 with weights 4× that scale (sharper attention, as after
 *     training). The worst tensors are parameter gradients (sums over tokens that cancel).
 *   - noise of relative size 1e-3 (x + 1e-3·‖x‖/√n·N(0, 1) per element): drift 1.0e-3, down
 *     to 7.4e-4 for a 32-element gradient.
 * Worst honest drift h = 1.5e-6, noise ν = 1e-3: the geometric mean √(h·ν) ≈ 3.9e-5
 * (3.4e-5 with the smallest noise draw), rounded down to 3e-5. That leaves a factor 20 above
 * the worst honest drift (67 above the worst thread drift) and 33 below the noise (25 below
 * its smallest draw). Deeper sections, wider layers and trained weights drift more (4× the
 * weights gave 3× the drift): rerun the bench before trusting this much beyond its range.
 */
export const ORT_TOLERANCE = 3e-5;

/** float32's smallest normal number: the floor of the reference norm (an all-zero reference). */
const FLOAT32_TINY = 2 ** -126;

/**
 * The relative L2 distance ‖a − b‖₂ / max(‖a‖₂, tiny) of `b` from the reference `a` (computed
 * in float64). Positions where both hold the same non-finite value (NaN and NaN, or the same
 * infinity) count as equal; a non-finite value in one that the other does not match, or
 * arrays of different lengths, give Infinity. Two all-zero arrays give 0.
 * @example
 * drift(Float32Array.of(3, 4), Float32Array.of(3, 4.005)) // 0.001
 */
export function drift(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return Number.POSITIVE_INFINITY;
  let diff = 0;
  let norm = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    const y = b[i];
    if (!Number.isFinite(x) || !Number.isFinite(y)) {
      if (Object.is(x, y)) continue;
      return Number.POSITIVE_INFINITY;
    }
    const d = x - y;
    diff += d * d;
    norm += x * x;
  }
  if (diff === 0) return 0;
  return Math.sqrt(diff) / Math.max(Math.sqrt(norm), FLOAT32_TINY);
}

/** The same bytes: compared as 32-bit words, so NaN payloads and the sign of zero count. */
function bitwiseEqual(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
}

/**
 * Whether two results of the same computation agree: on js the same bytes, on ort a drift
 * (relative to `a`, the reference) of at most ORT_TOLERANCE.
 * @example
 * agree('js', Float32Array.of(0), Float32Array.of(-0))        // false: the bytes differ
 * agree('ort', Float32Array.of(1, 2), Float32Array.of(1, 2))  // true
 */
export function agree(backend: ComputeBackend, a: Float32Array, b: Float32Array): boolean {
  if (backend === 'js') return bitwiseEqual(a, b);
  if (backend === 'ort') return drift(a, b) <= ORT_TOLERANCE;
  throw new InvalidArgumentError(`unknown compute backend '${String(backend)}' (use 'js' or 'ort')`);
}
