/**
 * Activation commitments after TOPLOC (Prime Intellect, arXiv 2501.16007; github.com/PrimeIntellect-ai/toploc): a
 * worker commits to a chunk of its outputs (32 positions of hidden states) by the top-k values by magnitude, as bfloat16
 * bit patterns, encoded as the polynomial through (index mod m, bits) over the prime field of 65497: 2 bytes of m, then
 * k coefficients of 2 bytes, 258 bytes for k = 128. A validator recomputes the chunk (one prefill, on any backend), takes
 * its own top-k, evaluates the committed polynomial at those indices and compares exponents and mantissas: honest float
 * drift moves a few mantissa units; other values (another model, a cheaper format, noise) change exponents and
 * mantissas at many of them, and an index the worker did not commit evaluates to a pseudo-random field element.
 *
 * As TOPLOC's code: the indices are reduced by the largest modulus ≤ 65497 that keeps them distinct; the polynomial is
 * found by Newton's divided differences and stored in the monomial basis (here lowest degree first, big-endian 16-bit
 * words); the check counts exponent mismatches and takes the mean and median (sorted[n/2]) of |Δmantissa| where the
 * exponents agree. Pure arithmetic: no thresholds here (they are calibrated per backend and format where they are used).
 */

/** Positions per committed chunk. */
export const COMMIT_CHUNK = 32;
/** Values committed per chunk. */
export const COMMIT_TOPK = 128;
/** The prime of the field the polynomial lives in (TOPLOC's MOD_N). */
export const COMMIT_PRIME = 65497;

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The bfloat16 bit pattern of `x` (rounded to nearest, ties to even; NaN stays NaN). */
export function bf16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0];
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x007fffff) !== 0) return 0x7fc0;
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The indices of the k values of largest magnitude, largest first (ties: the lower index first). */
export function topkIndices(values: Float32Array, k: number): number[] {
  const order = Array.from({ length: values.length }, (_, i) => i);
  order.sort((a, b) => Math.abs(values[b]) - Math.abs(values[a]) || a - b);
  return order.slice(0, Math.min(k, values.length));
}

/** The largest modulus m ≤ COMMIT_PRIME under which `indices` stay distinct. */
export function injectiveModulus(indices: readonly number[]): number {
  for (let m = COMMIT_PRIME; m > 0; m--) {
    const seen = new Set<number>();
    let ok = true;
    for (const i of indices) {
      const r = i % m;
      if (seen.has(r)) {
        ok = false;
        break;
      }
      seen.add(r);
    }
    if (ok) return m;
  }
  throw new RangeError('no modulus keeps these indices distinct');
}

const mod = (x: number): number => ((x % COMMIT_PRIME) + COMMIT_PRIME) % COMMIT_PRIME;

function inverse(a: number): number {
  // Fermat: a^(p−2) mod p; every product stays below 2^32, exact in a double
  let result = 1;
  let base = mod(a);
  for (let e = COMMIT_PRIME - 2; e > 0; e >>= 1) {
    if (e & 1) result = (result * base) % COMMIT_PRIME;
    base = (base * base) % COMMIT_PRIME;
  }
  return result;
}

/** The coefficients (lowest degree first) of the polynomial of degree < n through (xs[i], ys[i]) over the field. */
export function interpolate(xs: readonly number[], ys: readonly number[]): number[] {
  const n = xs.length;
  // Newton's divided differences, in place
  const c = ys.map(mod);
  for (let j = 1; j < n; j++) {
    for (let i = n - 1; i >= j; i--) c[i] = (mod(c[i] - c[i - 1]) * inverse(xs[i] - xs[i - j])) % COMMIT_PRIME;
  }
  // to the monomial basis: P = c[n−1]; P = P·(x − x_j) + c[j] for j = n−2 … 0
  const poly = new Array<number>(n).fill(0);
  poly[0] = c[n - 1];
  for (let j = n - 2; j >= 0; j--) {
    for (let d = n - 1; d >= 1; d--) poly[d] = mod(poly[d - 1] - ((poly[d] * xs[j]) % COMMIT_PRIME));
    poly[0] = mod(c[j] - ((poly[0] * xs[j]) % COMMIT_PRIME));
  }
  return poly;
}

/** The polynomial (coefficients lowest degree first) at x, over the field (Horner). */
export function evaluate(coefficients: readonly number[], x: number): number {
  let y = 0;
  const at = mod(x);
  for (let d = coefficients.length - 1; d >= 0; d--) y = (y * at + coefficients[d]) % COMMIT_PRIME;
  return y;
}

/**
 * The commitment of a chunk of values (a section's outputs over COMMIT_CHUNK positions, flattened): 2 + 2k bytes.
 * @example
 * commitChunk(hidden.data.subarray(0, 32 * H)).length // 258
 */
export function commitChunk(values: Float32Array, k = COMMIT_TOPK): Uint8Array {
  const indices = topkIndices(values, k);
  const m = injectiveModulus(indices);
  const coefficients = interpolate(indices.map((i) => i % m), indices.map((i) => bf16Bits(values[i])));
  const out = new Uint8Array(2 + 2 * k);
  const view = new DataView(out.buffer);
  view.setUint16(0, m);
  coefficients.forEach((c, i) => view.setUint16(2 + 2 * i, c));
  return out;
}

/** How a recomputed chunk compares with a commitment: exponent mismatches, and |Δmantissa| where the exponents agree. */
export interface ChunkCheck {
  expMismatches: number;
  /** Mean and median of |Δmantissa| (in units of bfloat16's last bit) over the agreeing exponents; Infinity if none agree. */
  mantMean: number;
  mantMedian: number;
}

/**
 * Compares recomputed values with a commitment (commitChunk's bytes), at the validator's own top-k indices.
 * @example
 * const { expMismatches, mantMean, mantMedian } = checkChunk(recomputed, proof)
 */
export function checkChunk(values: Float32Array, proof: Uint8Array, k = COMMIT_TOPK): ChunkCheck {
  if (proof.length !== 2 + 2 * k) throw new RangeError(`a commitment of ${proof.length} bytes, not ${2 + 2 * k}`);
  const view = new DataView(proof.buffer, proof.byteOffset, proof.byteLength);
  const m = view.getUint16(0);
  if (m === 0) throw new RangeError('a commitment whose modulus is 0');
  const coefficients = Array.from({ length: k }, (_, i) => view.getUint16(2 + 2 * i));
  let expMismatches = 0;
  const diffs: number[] = [];
  for (const i of topkIndices(values, k)) {
    const committed = evaluate(coefficients, i % m);
    const mine = bf16Bits(values[i]);
    if ((committed & 0x7f80) !== (mine & 0x7f80)) expMismatches++;
    else diffs.push(Math.abs((committed & 0x7f) - (mine & 0x7f)));
  }
  if (diffs.length === 0) return { expMismatches, mantMean: Infinity, mantMedian: Infinity };
  diffs.sort((a, b) => a - b);
  return { expMismatches, mantMean: diffs.reduce((a, b) => a + b, 0) / diffs.length, mantMedian: diffs[diffs.length >> 1] };
}
