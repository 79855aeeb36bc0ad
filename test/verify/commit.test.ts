// Activation commitments after TOPLOC (src/verify/records/commit.ts): the polynomial through the committed
// (index, 16 bits) points gives each back; a chunk's commitment is 514 bytes (the float32 words' high and low halves),
// its modulus first; the same values check with no difference, values moved by one bfloat16 unit differ by one unit,
// float32 rounding differences by a tiny fraction of one, other values mismatch at nearly every exponent, and flipped
// signs count as mismatches. A session's chunks are committed as they close.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  checkChunk, ChunkCommitter, closedChunks, COMMIT_BYTES, COMMIT_PRIME, commitChunk, evaluate, injectiveModulus, interpolate,
  topkIndices,
} from '../../src/verify/records/commit.ts';

/** A chunk of 32 positions × 64 hidden values, with a few large outliers as hidden states have. */
const chunk = (seed: number): Float32Array =>
  Float32Array.from({ length: 32 * 64 }, (_, i) => Math.sin(i * 1.3 + seed) * (1 + (i % 7)) * (i % 97 === 0 ? 20 : 1));

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

test('a chunk\'s commitment: 514 bytes, the modulus first; its own values check clean', () => {
  const values = chunk(1);
  const proof = commitChunk(values);
  assert.equal(proof.length, COMMIT_BYTES());
  assert.equal(COMMIT_BYTES(), 514);
  assert.equal((proof[0] << 8) | proof[1], COMMIT_PRIME, 'indices below 65497 keep the prime as their modulus');
  assert.deepEqual(checkChunk(values, proof), { expMismatches: 0, mantMean: 0, mantMedian: 0 });
});

test('values moved by about one bfloat16 unit differ by about one; float32 rounding by a tiny fraction; other values mismatch everywhere', () => {
  const values = chunk(1);
  const proof = commitChunk(values);
  const drifted = checkChunk(values.map((x) => x * (1 + 2 ** -7)), proof);
  assert.equal(drifted.expMismatches, 0);
  assert.ok(drifted.mantMean >= 0.5 && drifted.mantMean <= 2 && drifted.mantMedian <= 2, JSON.stringify(drifted));
  // a relative change of 1e-6 (honest float32 drift) is a few ten-thousandths of a bfloat16 unit: not 0, far below 1
  const rounding = checkChunk(values.map((x) => x * (1 + 1e-6)), proof);
  assert.equal(rounding.expMismatches, 0);
  assert.ok(rounding.mantMean > 0 && rounding.mantMean < 1e-3, JSON.stringify(rounding));
  const other = checkChunk(chunk(2), proof);
  assert.ok(other.expMismatches > 64, JSON.stringify(other));
  const flipped = checkChunk(values.map((x) => -x), proof);
  assert.equal(flipped.expMismatches, 128, 'every sign flipped is a mismatch');
});

test('chunks a computation closes; a session\'s chunks committed as they close, row by row', () => {
  assert.deepEqual(closedChunks(0, 32), [0]);
  assert.deepEqual(closedChunks(30, 4), [0]);
  assert.deepEqual(closedChunks(0, 31), []);
  assert.deepEqual(closedChunks(31, 1), [0]);
  assert.deepEqual(closedChunks(5, 64), [0, 1]);
  const width = 8;
  const rows = 2;
  const all = Float32Array.from({ length: rows * 64 * width }, (_, i) => Math.sin(i * 0.7) * (1 + (i % 5)));
  const at = (b: number, from: number, n: number) => all.subarray((b * 64 + from) * width, (b * 64 + from + n) * width);
  const step = (from: number, n: number) => {
    const v = new Float32Array(rows * n * width);
    for (let b = 0; b < rows; b++) v.set(at(b, from, n), b * n * width);
    return v;
  };
  const c = new ChunkCommitter(rows, width);
  // a prefill of 20 positions closes nothing; decoding steps up to position 31 close chunk 0 of both rows
  assert.deepEqual(c.push(step(0, 20), 0, 20), []);
  let proofs: Uint8Array[] = [];
  for (let p = 20; p < 32; p++) proofs = c.push(step(p, 1), p, 1);
  assert.equal(proofs.length, rows);
  for (let b = 0; b < rows; b++) assert.deepEqual(checkChunk(at(b, 0, 32), proofs[b]), { expMismatches: 0, mantMean: 0, mantMedian: 0 });
  // a gap: the chunk it began inside is not committed
  const gap = new ChunkCommitter(rows, width);
  assert.deepEqual(gap.push(step(40, 24), 40, 24), []);
  // a speculative pass cut: a chunk it closed at its last position opens again and closes with the kept positions
  const cut = new ChunkCommitter(rows, width);
  cut.push(step(0, 28), 0, 28);
  assert.equal(cut.push(step(28, 4), 28, 4).length, rows);
  assert.deepEqual(cut.truncate(30), []);
  const again = [...cut.push(step(30, 1), 30, 1), ...cut.push(step(31, 1), 31, 1)];
  for (let b = 0; b < rows; b++) assert.deepEqual(checkChunk(at(b, 0, 32), again[b]), { expMismatches: 0, mantMean: 0, mantMedian: 0 });
  // a pass that went on past the chunk it closed cannot reopen it, not even by a second cut
  const over = new ChunkCommitter(rows, width);
  over.push(step(0, 30), 0, 30);
  over.push(step(30, 6), 30, 6);
  assert.throws(() => over.truncate(31), /went on past the chunk it closed at 31/);
  assert.deepEqual(over.truncate(32).length, rows, 'a cut after the closing position keeps the chunk closed');
  assert.throws(() => over.truncate(31), /went on past the chunk it closed at 31/);
});

test('a malformed commitment is a RangeError, not a wrong verdict', () => {
  assert.throws(() => checkChunk(chunk(1), new Uint8Array(10)), RangeError);
  assert.throws(() => checkChunk(chunk(1), new Uint8Array(258)), /258 bytes, not 514/);
  assert.throws(() => checkChunk(chunk(1), new Uint8Array(514)), /modulus is 0/);
});
