// Activation commitments after TOPLOC (src/verify/records/commit.ts, #47's first piece): the polynomial through the
// committed (index, bfloat16 bits) points gives each back; a chunk's commitment is 258 bytes, its modulus first; the
// same values check with no mismatch, values moved by one bfloat16 unit move the mantissas by about one, and other
// values mismatch at nearly every exponent.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  bf16Bits, checkChunk, COMMIT_PRIME, COMMIT_TOPK, commitChunk, evaluate, injectiveModulus, interpolate, topkIndices,
} from '../../src/verify/records/commit.ts';

/** A chunk of 32 positions × 64 hidden values, with a few large outliers as hidden states have. */
const chunk = (seed: number): Float32Array =>
  Float32Array.from({ length: 32 * 64 }, (_, i) => Math.sin(i * 1.3 + seed) * (1 + (i % 7)) * (i % 97 === 0 ? 20 : 1));

test('bfloat16 bits: rounded to nearest even, NaN kept', () => {
  assert.equal(bf16Bits(1), 0x3f80);
  assert.equal(bf16Bits(-2), 0xc000);
  assert.equal(bf16Bits(NaN), 0x7fc0);
  assert.equal(bf16Bits(1 + 2 ** -8), 0x3f80, 'a tie rounds to the even mantissa');
  assert.equal(bf16Bits(1 + 3 * 2 ** -8), 0x3f82);
});

test('the polynomial over the field of 65497 passes through every committed point', () => {
  const xs = [3, 10, 7, 100, 2, 65496];
  const ys = [5, 65000, 0, 12345, 7, 1];
  const poly = interpolate(xs, ys);
  assert.deepEqual(xs.map((x) => evaluate(poly, x)), ys);
  assert.ok(poly.every((c) => c >= 0 && c < COMMIT_PRIME));
});

test('top-k by magnitude with ties to the lower index; a modulus that keeps the indices distinct', () => {
  assert.deepEqual(topkIndices(Float32Array.from([1, -3, 3, 0.5]), 3), [1, 2, 0]);
  assert.equal(injectiveModulus([1, 5, 9]), COMMIT_PRIME);
  const m = injectiveModulus([0, 65497, 131000]);
  assert.equal(new Set([0, 65497, 131000].map((i) => i % m)).size, 3);
});

test('a chunk\'s commitment: 258 bytes, the modulus first; its own values check clean', () => {
  const values = chunk(1);
  const proof = commitChunk(values);
  assert.equal(proof.length, 2 + 2 * COMMIT_TOPK);
  assert.equal((proof[0] << 8) | proof[1], COMMIT_PRIME, 'indices below 65497 keep the prime as their modulus');
  assert.deepEqual(checkChunk(values, proof), { expMismatches: 0, mantMean: 0, mantMedian: 0 });
});

test('values moved by about one bfloat16 unit move the mantissas by about one; other values mismatch everywhere', () => {
  const values = chunk(1);
  const proof = commitChunk(values);
  const drifted = checkChunk(values.map((x) => x * (1 + 2 ** -7)), proof);
  assert.equal(drifted.expMismatches, 0);
  assert.ok(drifted.mantMean >= 1 && drifted.mantMean <= 2 && drifted.mantMedian <= 2, JSON.stringify(drifted));
  const other = checkChunk(chunk(2), proof);
  assert.ok(other.expMismatches > COMMIT_TOPK / 2, JSON.stringify(other));
});

test('a malformed commitment is a RangeError, not a wrong verdict', () => {
  assert.throws(() => checkChunk(chunk(1), new Uint8Array(10)), RangeError);
  assert.throws(() => checkChunk(chunk(1), new Uint8Array(258)), /modulus is 0/);
});
