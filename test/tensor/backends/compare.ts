/**
 * How the conformance suite (suite.ts) compares a backend's results with the js kernels': the whole tensor within the
 * backend's stated tolerance (relative L2 distance, `drift` of src/verify/compare.ts, as verification measures it), and
 * every element within a bound scaled from the same tolerance (ELEMENTWISE), so that one wrong value among thousands,
 * which moves the whole tensor's distance too little to see, fails too. A tolerance of 0 is the same bits.
 */
import assert from 'node:assert/strict';
import type { Tensor } from '../../../src/tensor/index.ts';
import { drift } from '../../../src/verify/index.ts';

/** One result of a case: an output or a gradient, labelled. */
export interface Result {
  label: string;
  values: Tensor['data'];
}

/**
 * The elementwise bound, per result of tolerance τ: |got − ref| ≤ τ · (ATOL · max|ref| + RTOL · |ref|) at every
 * element (for int8 and int4 blocks: of what the block added to its input, as the distance is). This is the one place
 * its factors are chosen, from what honest backends measured against js: the worst element of each result, as
 * |got − ref| / (τ · (max|ref| + |ref|)), the largest over every case and block of the suite (ort at its default
 * thresholds and with every size native, on a 2-core x86-64 machine; the same figures for both):
 *   - float32 and bf16 weights (τ = 3e-5): ops ≤ 0.011, blocks trained and decoding ≤ 0.023, traced steps ≤ 0.012;
 *   - int8 (τ = 0.1) and int4 (τ = 0.08): ops ≤ 0.17, blocks ≤ 0.18, traced steps ≤ 0.18 (int4: the
 *     gated MLP, Llama's block decoding).
 * Factors of 1 leave 5.5× above the worst quantized element and 43× above the worst float32 one, and catch the fault
 * the distance alone let through: one output of a layer norm moved by 0.1% (layerNorm (wide), y[0] = −1.118 of
 * max|y| = 6.6: distance 8.5e-6 under τ = 3e-5, element 4.8× its bound). A 0.1% error in one element is caught where
 * |ref| > τ · max|ref| / (1e-3 − τ) ≈ max|ref| / 32 at τ = 3e-5; smaller elements are within the atol term.
 */
export const ELEMENTWISE = { atol: 1, rtol: 1 } as const;

/** The same bytes (the same typed array), so NaN payloads and the sign of zero count. */
export function sameBits(a: Tensor['data'], b: Tensor['data']): boolean {
  if (a.constructor !== b.constructor || a.length !== b.length) return false;
  const x = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const y = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  return x.every((v, i) => v === y[i]);
}

/** `values` less `base` where one is given (what a block added to its input). */
const added = (values: ArrayLike<number>, base: ArrayLike<number> | undefined): Float64Array =>
  Float64Array.from(values, (v, i) => (base === undefined ? v : v - base[i]));

/**
 * The worst element of `got` against `ref`, as a multiple of the elementwise bound at tolerance τ = 1 (what ELEMENTWISE's
 * factors times τ must exceed): max over i of |got − ref| / (ATOL · max|ref| + RTOL · |ref|), with its index.
 * @example
 * elementwise(Float32Array.of(1, 2), Float32Array.of(1, 2.002)) // { worst: 0.002 / (2 + 2) = 5e-4, at: 1 }
 */
export function elementwise(ref: ArrayLike<number>, got: ArrayLike<number>, base?: ArrayLike<number>): { worst: number; at: number } {
  const r = added(ref, base);
  const g = added(got, base);
  let scale = 0;
  for (const v of r) scale = Math.max(scale, Math.abs(v));
  let worst = 0;
  let at = -1;
  r.forEach((v, i) => {
    const d = Math.abs(g[i] - v);
    const bound = ELEMENTWISE.atol * scale + ELEMENTWISE.rtol * Math.abs(v);
    const ratio = d === 0 ? 0 : d / bound; // Infinity where the bound is 0, NaN where got is NaN: both fail
    if (!(ratio <= worst)) {
      worst = Number.isNaN(ratio) ? Infinity : ratio;
      at = i;
    }
  });
  return { worst, at };
}

/** The largest whole-tensor distance and elementwise ratio (in units of τ) that a comparison met. */
export interface Agreement {
  drift: number;
  elementwise: number;
}

/**
 * Asserts that `got` holds the results of `ref` (the same labels) within `tolerance`: every result's relative L2
 * distance at most τ and every element within ELEMENTWISE's bound at τ (0: the same bits; int32 results always
 * exactly). With `bases` (the inputs of a block computed with int8 or int4 weights, each under the label of its
 * output), those results are compared on what the block added to its input, as src/verify/compare.ts measures them.
 * Returns the worst distance and elementwise ratio met.
 * @example
 * assertAgree('add', ref, got, 3e-5) // { drift: 1.2e-7, elementwise: 4e-4 }
 */
export function assertAgree(what: string, ref: Result[], got: Result[], tolerance: number, bases: Result[] = []): Agreement {
  assert.deepEqual(got.map((r) => r.label), ref.map((r) => r.label), `${what}: the same outputs and gradients`);
  const worst: Agreement = { drift: 0, elementwise: 0 };
  ref.forEach((r, i) => {
    const g = got[i].values;
    const label = `${what}, ${r.label}`;
    if (tolerance === 0 || r.values instanceof Int32Array) {
      assert.ok(sameBits(r.values, g), `${label}: not the reference's bits`);
      return;
    }
    assert.equal(g.length, r.values.length, `${label}: ${g.length} values, the reference has ${r.values.length}`);
    const base = bases.find((b) => b.label === r.label)?.values;
    const d = drift(r.values as Float32Array, g as Float32Array, base as Float32Array | undefined);
    assert.ok(d <= tolerance, `${label}: ${d.toExponential(2)} from the reference (tolerance ${tolerance})`);
    const e = elementwise(r.values, g, base);
    const ratio = e.worst / tolerance;
    const input = base ? ` (input ${base[e.at]})` : '';
    const bound = `tolerance ${tolerance} × (${ELEMENTWISE.atol} · max|ref| + ${ELEMENTWISE.rtol} · |ref|)`;
    assert.ok(ratio <= 1, `${label}: element ${e.at} is ${g[e.at]}, the reference ${r.values[e.at]}${input}: ${ratio.toFixed(1)}× its bound (${bound})`);
    worst.drift = Math.max(worst.drift, d);
    worst.elementwise = Math.max(worst.elementwise, ratio);
  });
  return worst;
}

/** The diagnostic of an agreement: the distance and the elementwise ratio met. */
export const describeAgreement = (a: Agreement): string =>
  `drift ${a.drift.toExponential(1)}, worst element ${a.elementwise.toExponential(1)} of its bound`;
