/**
 * Activation commitments after TOPLOC (Prime Intellect, arXiv 2501.16007; github.com/PrimeIntellect-ai/toploc): a
 * worker commits to a chunk of its outputs (32 positions of hidden states) by the top-k values by magnitude, encoded as
 * polynomials through (index mod m, bits) over the prime field of 65497. A validator recomputes the chunk (one prefill,
 * on any backend), takes its own top-k, evaluates the committed polynomials at those indices and compares: honest float
 * drift moves values by a tiny share of a unit; other values (another model, a cheaper format, noise) change exponents
 * and mantissas at many of them, and an index the worker did not commit evaluates to a pseudo-random field element.
 *
 * As TOPLOC's code: the indices are reduced by the largest modulus ≤ 65497 that keeps them distinct; a polynomial is
 * found by Newton's divided differences and stored in the monomial basis (here lowest degree first, big-endian 16-bit
 * words); the check counts exponent mismatches and takes the mean and median (sorted[n/2]) of the differences where the
 * exponents agree. Where this differs from TOPLOC, and why:
 * - TOPLOC commits each value's bfloat16 bits (258 bytes for k = 128). Here the whole float32 word is committed, as two
 *   polynomials over the same points (its high and its low 16 bits: 514 bytes). bfloat16's 8-bit mantissa hides noise
 *   of 1e-3 in about half of the chunks (bench/commit-drift.ts), while honest float32 drift between backends stays near
 *   1e-6: with the low bits the difference is measured exactly, in units of bfloat16's last place (fractions of one).
 * - A sign that differs counts with the exponent mismatches (TOPLOC compares exponent and mantissa bits only, so a chunk
 *   with every sign flipped would pass).
 * Pure arithmetic: no thresholds here (they are calibrated per format where they are used: COMMIT_THRESHOLDS).
 */

/** Positions per committed chunk. */
export const COMMIT_CHUNK = 32;
/** Values committed per chunk. */
export const COMMIT_TOPK = 128;
/** The prime of the field the polynomial lives in (TOPLOC's MOD_N). */
export const COMMIT_PRIME = 65497;
/** Bytes of one chunk's commitment: the modulus, then k coefficients of the high and k of the low 16 bits (514 for k = 128). */
export const COMMIT_BYTES = (k = COMMIT_TOPK): number => 2 + 4 * k;

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/**
 * The indices of the k values of largest magnitude, largest first (ties: the lower index first; NaN ranks last). One
 * pass with a bounded min-heap of the best k so far: O(n log k), most values rejected by one comparison.
 */
export function topkIndices(values: Float32Array, k: number): number[] {
  const n = Math.min(k, values.length);
  if (n <= 0) return [];
  const mag = new Float32Array(values.length);
  for (let i = 0; i < values.length; i++) {
    const a = Math.abs(values[i]);
    mag[i] = a === a ? a : -1; // NaN below everything
  }
  // heap[0] is the worst kept: the smallest magnitude, and among equals the highest index
  const heap = new Int32Array(n);
  let size = 0;
  const worse = (a: number, b: number) => mag[a] < mag[b] || (mag[a] === mag[b] && a > b);
  for (let i = 0; i < values.length; i++) {
    if (size < n) {
      let at = size++;
      heap[at] = i;
      while (at > 0) {
        const up = (at - 1) >> 1;
        if (!worse(heap[at], heap[up])) break;
        const t = heap[at];
        heap[at] = heap[up];
        heap[up] = t;
        at = up;
      }
    } else if (mag[i] > mag[heap[0]]) {
      // a later index never wins a tie: only a strictly larger magnitude enters
      heap[0] = i;
      for (let at = 0; ;) {
        const l = 2 * at + 1;
        const r = l + 1;
        let w = at;
        if (l < size && worse(heap[l], heap[w])) w = l;
        if (r < size && worse(heap[r], heap[w])) w = r;
        if (w === at) break;
        const t = heap[at];
        heap[at] = heap[w];
        heap[w] = t;
        at = w;
      }
    }
  }
  return Array.from(heap).sort((a, b) => mag[b] - mag[a] || a - b);
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

const INV_PRIME = 1 / COMMIT_PRIME;

/** a·b mod p for residues a, b < p: the product is below 2^32 (exact in a double); the quotient by a multiply, corrected. */
function mulmod(a: number, b: number): number {
  const t = a * b;
  let r = t - Math.floor(t * INV_PRIME) * COMMIT_PRIME;
  if (r < 0) r += COMMIT_PRIME;
  else if (r >= COMMIT_PRIME) r -= COMMIT_PRIME;
  return r;
}

/** The inverses of 1 … p − 1 in the field, built once (inv[i] = −(p div i)·inv[p mod i]): 256 KB. */
let inverses: Uint16Array | null = null;

function inverse(a: number): number {
  if (!inverses) {
    inverses = new Uint16Array(COMMIT_PRIME);
    inverses[1] = 1;
    const p = COMMIT_PRIME;
    for (let i = 2; i < p; i++) inverses[i] = (p - ((Math.floor(p / i) * inverses[p % i]) % p)) % p;
  }
  return inverses[a >= 0 && a < COMMIT_PRIME ? a : mod(a)];
}

/** The coefficients (lowest degree first) of the polynomial of degree < n through (xs[i], ys[i]) over the field. */
export function interpolate(xs: readonly number[], ys: readonly number[]): number[] {
  return interpolateAll(xs, [ys])[0];
}

/**
 * interpolate for several value sets over the same points at once: the divided differences' inverses and the basis
 * change's steps are shared (a commitment interpolates a word's high and low halves over the same indices).
 */
export function interpolateAll(xs: readonly number[], yss: readonly (readonly number[])[]): number[][] {
  const n = xs.length;
  const p = COMMIT_PRIME;
  const x = Float64Array.from(xs, mod);
  // Newton's divided differences, in place (every product of two residues stays below 2^32: exact in a double)
  const cs = yss.map((ys) => Float64Array.from(ys, mod));
  for (let j = 1; j < n; j++) {
    for (let i = n - 1; i >= j; i--) {
      const dx = x[i] - x[i - j];
      const inv = inverse(dx < 0 ? dx + p : dx);
      for (const c of cs) {
        const d = c[i] - c[i - 1];
        c[i] = mulmod(d < 0 ? d + p : d, inv);
      }
    }
  }
  // to the monomial basis: P = c[n−1]; P = P·(x − x_j) + c[j] for j = n−2 … 0
  return cs.map((c) => {
    const poly = new Float64Array(n);
    poly[0] = c[n - 1];
    for (let j = n - 2; j >= 0; j--) {
      const xj = x[j];
      for (let d = n - 1; d >= 1; d--) {
        const v = poly[d - 1] - mulmod(poly[d], xj);
        poly[d] = v < 0 ? v + p : v;
      }
      const v = c[j] - mulmod(poly[0], xj);
      poly[0] = v < 0 ? v + p : v;
    }
    return Array.from(poly);
  });
}

/** The polynomial (coefficients lowest degree first) at x, over the field (Horner). */
export function evaluate(coefficients: readonly number[], x: number): number {
  let y = 0;
  const at = mod(x);
  for (let d = coefficients.length - 1; d >= 0; d--) {
    y = mulmod(y, at) + coefficients[d];
    if (y >= COMMIT_PRIME) y -= COMMIT_PRIME;
  }
  return y;
}

/**
 * The commitment of a chunk of values (a section's outputs over COMMIT_CHUNK positions, flattened): COMMIT_BYTES(k).
 * @example
 * commitChunk(hidden.data.subarray(0, 32 * H)).length // 514
 */
export function commitChunk(values: Float32Array, k = COMMIT_TOPK): Uint8Array {
  const indices = topkIndices(values, k);
  const m = injectiveModulus(indices);
  const xs = indices.map((i) => i % m);
  const bits = new Uint32Array(Float32Array.from(indices, (i) => values[i]).buffer);
  const [high, low] = interpolateAll(xs, [Array.from(bits, (b) => b >>> 16), Array.from(bits, (b) => b & 0xffff)]);
  const out = new Uint8Array(COMMIT_BYTES(k));
  const view = new DataView(out.buffer);
  view.setUint16(0, m);
  high.forEach((c, i) => view.setUint16(2 + 2 * i, c));
  low.forEach((c, i) => view.setUint16(2 + 2 * k + 2 * i, c));
  return out;
}

/** How a recomputed chunk compares with a commitment: exponent mismatches, and |Δmantissa| where the exponents agree. */
export interface ChunkCheck {
  /** Values whose sign or exponent differ from the committed ones (an index the worker did not commit counts here). */
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
  if (proof.length !== COMMIT_BYTES(k)) throw new RangeError(`a commitment of ${proof.length} bytes, not ${COMMIT_BYTES(k)}`);
  const view = new DataView(proof.buffer, proof.byteOffset, proof.byteLength);
  const m = view.getUint16(0);
  if (m === 0) throw new RangeError('a commitment whose modulus is 0');
  const high = Array.from({ length: k }, (_, i) => view.getUint16(2 + 2 * i));
  const low = Array.from({ length: k }, (_, i) => view.getUint16(2 + 2 * k + 2 * i));
  let expMismatches = 0;
  const diffs: number[] = [];
  for (const i of topkIndices(values, k)) {
    f32[0] = values[i];
    const mine = u32[0];
    // the low half lives in the field: a committed 65497 … 65535 reads back as 0 … 38, so either may be meant (the
    // nearer to the validator's own is taken; honest differences are tiny next to 65497 units)
    let lo = evaluate(low, i % m);
    if (lo + COMMIT_PRIME <= 0xffff && Math.abs(lo + COMMIT_PRIME - (mine & 0xffff)) < Math.abs(lo - (mine & 0xffff))) lo += COMMIT_PRIME;
    u32[0] = ((evaluate(high, i % m) << 16) | lo) >>> 0;
    const committed = f32[0];
    const theirs = u32[0];
    if (((theirs ^ mine) & 0xff800000) !== 0 || !Number.isFinite(committed)) {
      expMismatches++;
      continue;
    }
    // |Δ| in units of bfloat16's last place at the value's exponent (2^(e − 127 − 7))
    diffs.push(Math.abs(committed - values[i]) / 2 ** (((mine >>> 23) & 0xff) - 134));
  }
  if (diffs.length === 0) return { expMismatches, mantMean: Infinity, mantMedian: Infinity };
  diffs.sort((a, b) => a - b);
  return { expMismatches, mantMean: diffs.reduce((a, b) => a + b, 0) / diffs.length, mantMedian: diffs[diffs.length >> 1] };
}

/**
 * The chunks a computation over positions [from, from + steps) closes: each j whose last position 32j + 31 it
 * computes. A record of that computation carries their commitments, chunk by chunk and row by row.
 * @example
 * closedChunks(30, 4) // [0]: positions 30 … 33 close chunk 0 (0 … 31)
 */
export function closedChunks(from: number, steps: number): number[] {
  const out: number[] = [];
  for (let j = Math.ceil((from + 1) / COMMIT_CHUNK) - 1; COMMIT_CHUNK * j + COMMIT_CHUNK - 1 < from + steps; j++) {
    if (COMMIT_CHUNK * j + COMMIT_CHUNK - 1 >= from) out.push(j);
  }
  return out;
}

/**
 * A session's chunk under way, row by row: each computation's values ([rows, steps, width], positions in order) are
 * pushed, and a chunk whose COMMIT_CHUNK positions were all pushed is committed. A push that does not follow the last
 * one (a gap) starts over at its own position: a chunk is only committed whole.
 * @example
 * const c = new ChunkCommitter(1, hidden); c.push(values, 0, 32) // [514 bytes]: chunk 0 of row 0
 */
export class ChunkCommitter {
  private readonly buffer: Float32Array;
  /** The next position expected, and the first position of the open chunk held in the buffer. */
  private next = 0;
  private start = 0;

  constructor(
    readonly rows: number,
    readonly width: number,
  ) {
    this.buffer = new Float32Array(rows * COMMIT_CHUNK * width);
  }

  /** The last push: its first position, the open chunk's start before it, and each chunk it closed (its proofs, if whole). */
  private last: { from: number; end: number; start: number; closed: { at: number; proofs: Uint8Array[] }[] } | null = null;

  /** Adds positions [from, from + steps) of every row; returns the commitments of the chunks they closed. */
  push(values: Float32Array, from: number, steps: number): Uint8Array[] {
    const { rows, width, buffer } = this;
    if (values.length !== rows * steps * width) throw new RangeError(`${values.length} values are not [${rows}, ${steps}, ${width}]`);
    if (from !== this.next) this.start = from;
    this.last = { from, end: from + steps, start: this.start, closed: [] };
    const proofs: Uint8Array[] = [];
    for (let t = 0; t < steps; t++) {
      const p = from + t;
      const slot = p % COMMIT_CHUNK;
      for (let b = 0; b < rows; b++) {
        buffer.set(values.subarray((b * steps + t) * width, (b * steps + t + 1) * width), (b * COMMIT_CHUNK + slot) * width);
      }
      if (slot === COMMIT_CHUNK - 1) {
        // whole only if the open chunk began at its first position
        const closed: Uint8Array[] = [];
        if (this.start <= p - slot) {
          const size = COMMIT_CHUNK * width;
          for (let b = 0; b < rows; b++) closed.push(commitChunk(buffer.subarray(b * size, (b + 1) * size)));
        }
        proofs.push(...closed);
        this.last.closed.push({ at: p, proofs: closed });
        this.start = p + 1;
      }
    }
    this.next = from + steps;
    return proofs;
  }

  /**
   * Drops the positions from `length` on, all of them of the last push (a speculative pass's rejected drafts). The
   * chunks it closed before `length` stay closed, and their commitments are returned again (for the record of the
   * positions kept); a chunk it closed at or after `length` opens again, which needs the push to have ended there (past
   * that, its positions were written over the chunk's).
   */
  truncate(length: number): Uint8Array[] {
    const last = this.last;
    if (!last || length < last.from || length > this.next) throw new RangeError(`cannot keep ${length} positions: the last step began at ${last?.from ?? this.next}`);
    const kept = last.closed.filter((c) => c.at < length);
    const reopened = last.closed.find((c) => c.at >= length);
    // (against where the push ended, not where an earlier cut left it: what it wrote past a closed chunk stays written)
    if (reopened && reopened.at !== last.end - 1) {
      throw new RangeError(`a step that went on past the chunk it closed at ${reopened.at} cannot be cut inside that chunk`);
    }
    this.start = kept.length > 0 ? kept[kept.length - 1].at + 1 : last.start;
    this.next = length;
    this.last = { ...last, closed: kept };
    return kept.flatMap((c) => c.proofs);
  }
}
