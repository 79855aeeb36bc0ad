/**
 * Output comparison for proof-of-learning verification: a verifier re-executes a record and
 * compares what it gets with what the worker claimed. On the js backend the engine is bitwise
 * reproducible, so the results must be the same bytes; on onnxruntime ("ort") the order in which
 * sums are accumulated depends on the kernel, the CPU and the thread count, so results agree
 * when they lie within a calibrated relative distance (ORT_TOLERANCE; with compact weights, the
 * tolerance of their format: ORT_TOLERANCES).
 */

import { InvalidArgumentError } from '../errors.ts';
import type { Tensor, WeightFormat } from '../tensor/index.ts';

/** The backend a result was computed on (the tensor layer's backend names). */
export type ComputeBackend = 'js' | 'ort';

/** What a section's matrices are held in: float32, or a compact format (bf16, int8, int4). */
export type ComputeFormat = WeightFormat | 'f32';

/**
 * The largest relative L2 distance ‖a − b‖₂ / ‖a‖₂ (see `drift`) at which two ort results of
 * the same computation agree: 3e-5.
 *
 * Derivation. float32 rounds with unit roundoff u = 2⁻²⁴ ≈ 6.0e-8. A dot product of length n
 * summed in two different orders (another thread split, another CPU's kernel) differs by at
 * most γₙ = n·u / (1 − n·u) ≈ n·u relative to Σ|aᵢbᵢ|: the worst-case forward error of a sum,
 * ≈ 1.8e-4 at n = 3072 (a 768-wide model's MLP). That bound needs every rounding error to line up; they
 * are independent with zero mean, so in practice they grow like √n·u: ≈ 3.3e-6 at n = 3072,
 * ≈ 6.3e-6 at n = 11008 (a 7B decoder's MLP), and what is measured is smaller still.
 *
 * Measured (bench/ort-drift.ts; AMD EPYC, AVX-512; sections of 2 blocks (one of 4, one of the
 * final norm and head), the GPT-2 layout and the shared decoder, hidden 32 … 768, 32 … 128 tokens; forward output,
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

/**
 * The tolerance of ort results by the format a section's matrices are held in: bf16 as float32
 * (ORT_TOLERANCE, on the outputs), int8 and int4 0.1 and 0.08 on what the section adds to its
 * input (output − input, see `agree`'s `base`).
 *
 * bf16 is computed in float32 (each weight widened exactly), so its drift is float32's.
 * Measured (bench/compact-drift.ts; a decoding session on shared-decoder sections of 2 blocks, hidden
 * 256 … 768, and of 8 blocks, hidden 256; inputs the embedding of ids, or unit normal; initial
 * weights and 4× them; max over every step's output): ort 1 vs 2 threads ≤ 1.8e-6, ort vs js
 * ≤ 2.0e-6: the float32 figures above, so ORT_TOLERANCE stands (15× above).
 *
 * int8 and int4 go through MatMulNBits at accuracy level 4, which quantizes each product's
 * activations to int8 in blocks of 32: that rounding is a step function of the input, and the
 * low-bit differences of another CPU's float ops (attention, norms, softmax) move some values
 * across a step, product after product. Measured (same bench, on output − input):
 *   - ort 1 vs 2 threads: 0 (MatMulNBits splits rows, never a sum).
 *   - MatMulNBits with every other op on the js kernels (as another CPU's float ops round):
 *     int8 ≤ 3.0e-2, int4 ≤ 2.1e-2 (8 blocks, 4× weights); ≤ 1.6e-2 over 2 blocks; as low as
 *     5e-7 where no value crosses a step.
 *   - a CPU whose MatMulNBits takes the float path (no int8 kernels; accuracy level 0) against
 *     the exact js kernels: ≤ 2.4e-6. reexecute compares against that path too (re-run on js at
 *     ORT_TOLERANCE), so either honest path passes; ort's int8 path vs js is ≤ 4.9e-2.
 *   - cheats: skipping one block of 8: ≥ 0.35 (of 2: ≥ 0.65); computing int4 while holding
 *     int8: ≥ 0.13; one packed byte of a weight changed: 2e-3 … 3.2e-2 (caught only on js).
 * Worst honest drift h (int8 3.0e-2, int4 2.1e-2), the smallest cheat to catch ν = skipping one
 * block of 8 (0.35, 0.36): the geometric mean √(h·ν) ≈ 0.10 (int8), 0.086 (int4), rounded down
 * to 0.1 and 0.08. That leaves a factor 3.4 (int8) and 3.9 (int4) above the worst honest drift
 * and 3.5 and 4.5 below a skipped block. What passes on ort: any result within that share of the
 * section's work: noise up to 10% (8%) of it, a changed byte of a weight, and a block's part
 * done at lower precision. Deeper sections and trained weights drift more (8 blocks drifted 2×
 * of 2): rerun the bench before trusting these beyond its range; on js every record is exact.
 */
export const ORT_TOLERANCES: Readonly<Record<ComputeFormat, number>> = { f32: ORT_TOLERANCE, bf16: ORT_TOLERANCE, int8: 0.1, int4: 0.08 };

/** The formats whose results are compared on what the section adds to its input (quantized activations: see ORT_TOLERANCES). */
const ON_CONTRIBUTION: ReadonlySet<ComputeFormat> = new Set(['int8', 'int4']);

/** float32's smallest normal number: the floor of the reference norm (an all-zero reference). */
const FLOAT32_TINY = 2 ** -126;

/**
 * The relative L2 distance ‖a − b‖₂ / max(‖a‖₂, tiny) of `b` from the reference `a` (computed
 * in float64); with `base`, of b − base from a − base (what a section added to its input).
 * Positions where both hold the same non-finite value (NaN and NaN, or the same infinity)
 * count as equal; a non-finite value in one that the other does not match, or arrays of
 * different lengths, give Infinity. Two all-zero arrays give 0.
 * @example
 * drift(Float32Array.of(3, 4), Float32Array.of(3, 4.005)) // 0.001
 * drift(Float32Array.of(4, 5), Float32Array.of(4, 5.005), Float32Array.of(1, 1)) // 0.001
 */
export function drift(a: Float32Array, b: Float32Array, base?: Float32Array): number {
  if (a.length !== b.length || (base && base.length !== a.length)) return Number.POSITIVE_INFINITY;
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
    const r = base ? x - base[i] : x;
    diff += d * d;
    norm += r * r;
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

/** The tolerance of ort results computed with matrices held in `format` (ORT_TOLERANCE for float32). */
export function ortTolerance(format: ComputeFormat = 'f32'): number {
  if (!Object.hasOwn(ORT_TOLERANCES, format)) throw new InvalidArgumentError(`unknown weight format '${String(format)}' (one of ${Object.keys(ORT_TOLERANCES).join(', ')})`);
  return ORT_TOLERANCES[format];
}

/** Loosest first: a section whose matrices were held in several formats is compared at the loosest one's tolerance. */
const LOOSEST: readonly ComputeFormat[] = ['int4', 'int8', 'bf16'];

/** The format a section's weights compute in: the coarsest compact format among them, or 'f32' when none is packed. */
export function formatOfWeights(weights: Iterable<Tensor>): ComputeFormat {
  const held = new Set<ComputeFormat>();
  for (const t of weights) if (t.packed) held.add(t.packed.format);
  return LOOSEST.find((f) => held.has(f)) ?? 'f32';
}

/**
 * Whether two results of the same computation agree: on js the same bytes, on ort a drift
 * (relative to `a`, the reference) of at most the tolerance of the format the section's
 * matrices were held in (ortTolerance; float32: ORT_TOLERANCE). For int8 and int4 the drift is
 * that of what the section added to its input `base` (output − input), when the caller has it
 * and it has the output's size (a section of blocks); of the outputs otherwise.
 * @example
 * agree('js', Float32Array.of(0), Float32Array.of(-0))                      // false: the bytes differ
 * agree('ort', Float32Array.of(1, 2), Float32Array.of(1, 2))                // true
 * agree('ort', Float32Array.of(3, 4), Float32Array.of(3, 4.4), 'int8')      // true: 0.08 ≤ 0.1
 */
export function agree(backend: ComputeBackend, a: Float32Array, b: Float32Array, format: ComputeFormat = 'f32', base?: Float32Array): boolean {
  if (backend === 'js') return bitwiseEqual(a, b);
  if (backend === 'ort') {
    const tolerance = ortTolerance(format);
    const onContribution = ON_CONTRIBUTION.has(format) && base !== undefined && base.length === a.length;
    return drift(a, b, onContribution ? base : undefined) <= tolerance;
  }
  throw new InvalidArgumentError(`unknown compute backend '${String(backend)}' (use 'js' or 'ort')`);
}
