import { InvalidArgumentError } from '../errors.ts';

/**
 * Orthonormal 2-D DCT-II over blocks of a parameter, and its inverse (DCT-III).
 *
 * A tensor of any shape is viewed as a matrix [rows, cols]: a scalar is [1, 1], a vector [n] is
 * [1, n], and rank ≥ 2 keeps its last dim as cols and multiplies the leading dims into rows.
 * The matrix is cut into blocks [br, bc], where br (bc) is the largest divisor of rows (cols)
 * that is ≤ `chunk` (as Templar's ChunkingTransformer does), so every shape tiles exactly with
 * no padding. Coefficients are laid out block by block (blocks in row-major order of the block
 * grid), each block row-major, so one block's coefficients are contiguous.
 *
 * Each block is transformed as Y = D_r · X · D_cᵀ with D_n[k][i] = s_k cos(π (2i + 1) k / 2n),
 * s_0 = √(1/n), s_k = √(2/n): orthonormal, so energy is preserved and the inverse is the
 * transpose. The forward pass is separable (rows, then cols) with Lee's fast 1-D DCT; the
 * inverse multiplies by the cached basis matrices, skipping the zero rows of sparse input.
 * Arithmetic is float64 in a fixed order and results are stored as float32, so the same input
 * gives bit-identical output on every machine running the same code (V8's Math.cos is fdlibm).
 */

/** The largest rank a parameter may have (as the tensor frames allow). */
export const MAX_RANK = 8;
/** The most elements one parameter may have: 2^28 float32 = 1 GiB dense, beyond any layer we train. */
export const MAX_ELEMENTS = 2 ** 28;
/** The largest block side: 256 × 256 = 65,536 coefficients, so an index inside a block fits in a u16. */
export const MAX_CHUNK = 256;

/** How a tensor is cut into DCT blocks. */
export interface BlockLayout {
  /** Rows and cols of the matrix view of the tensor. */
  rows: number;
  cols: number;
  /** Block rows and block cols (divisors of rows and cols). */
  br: number;
  bc: number;
  /** Number of blocks: (rows / br) × (cols / bc). */
  blocks: number;
}

/** The largest divisor of `dim` that is ≤ `chunk`. */
export function blockSide(dim: number, chunk: number): number {
  for (let d = Math.min(dim, chunk); d > 1; d--) if (dim % d === 0) return d;
  return 1;
}

/**
 * Checks a shape (integers ≥ 1, rank ≤ MAX_RANK, at most MAX_ELEMENTS elements) and returns
 * its matrix view [rows, cols]. Throws InvalidArgumentError otherwise.
 */
export function matrixView(shape: readonly number[]): [number, number] {
  if (!Array.isArray(shape) || shape.length > MAX_RANK) throw new InvalidArgumentError(`a shape has rank 0..${MAX_RANK}, got [${shape}]`);
  let size = 1;
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 1) throw new InvalidArgumentError(`shape [${shape}] has a dim that is not an integer ≥ 1`);
    size *= d;
    if (size > MAX_ELEMENTS) throw new InvalidArgumentError(`shape [${shape}] has more than ${MAX_ELEMENTS} elements`);
  }
  const cols = shape.length === 0 ? 1 : shape[shape.length - 1];
  return [size / cols, cols];
}

/**
 * The block layout of a tensor of `shape` for a given `chunk` (1..MAX_CHUNK).
 * @example blockShape([96, 40], 64) // { rows: 96, cols: 40, br: 48, bc: 40, blocks: 2 }
 */
export function blockShape(shape: readonly number[], chunk: number): BlockLayout {
  if (!Number.isInteger(chunk) || chunk < 1 || chunk > MAX_CHUNK) throw new InvalidArgumentError(`chunk must be an integer in 1..${MAX_CHUNK}, got ${chunk}`);
  const [rows, cols] = matrixView(shape);
  const br = blockSide(rows, chunk);
  const bc = blockSide(cols, chunk);
  return { rows, cols, br, bc, blocks: (rows / br) * (cols / bc) };
}

const bases = new Map<number, Float64Array>();

/** The orthonormal DCT-II matrix of size n (row k = frequency k), row-major, cached by size. */
export function dctBasis(n: number): Float64Array {
  let d = bases.get(n);
  if (d === undefined) {
    d = new Float64Array(n * n);
    for (let k = 0; k < n; k++) {
      const s = Math.sqrt((k === 0 ? 1 : 2) / n);
      for (let i = 0; i < n; i++) d[k * n + i] = s * Math.cos((Math.PI * (2 * i + 1) * k) / (2 * n));
    }
    bases.set(n, d);
  }
  return d;
}

function checkLayout(length: number, rows: number, cols: number, br: number, bc: number): void {
  const ok = [rows, cols, br, bc].every((v) => Number.isInteger(v) && v >= 1) && rows % br === 0 && cols % bc === 0;
  if (!ok) throw new InvalidArgumentError(`blocks [${br}, ${bc}] do not tile a [${rows}, ${cols}] matrix`);
  if (length !== rows * cols) throw new InvalidArgumentError(`${length} values cannot be a [${rows}, ${cols}] matrix`);
}

/**
 * Forward blockwise DCT of a row-major [rows, cols] matrix; returns the coefficients block by
 * block (see the layout above). Blocks [br, bc] must tile the matrix. Separable: Lee's fast
 * DCT (fdct below) along the cols of every row of a block at once, then along its rows,
 * then scaled to the orthonormal basis.
 */
export function dctBlocks(x: Float32Array, rows: number, cols: number, br: number, bc: number): Float32Array {
  checkLayout(x.length, rows, cols, br, bc);
  const out = new Float32Array(rows * cols);
  const sr = scales(br);
  const sc = scales(bc);
  const xt = new Float64Array(bc * br); // Xᵀ of one block, [bc, br], then (X · D_cᵀ)ᵀ
  const t = new Float64Array(br * bc); // X · D_cᵀ, [br, bc], then D_r · X · D_cᵀ
  const tmp = new Float64Array(br * bc); // scratch
  let o = 0;
  for (let r0 = 0; r0 < rows; r0 += br) {
    for (let c0 = 0; c0 < cols; c0 += bc) {
      for (let i = 0; i < br; i++) {
        const xRow = (r0 + i) * cols + c0;
        for (let j = 0; j < bc; j++) xt[j * br + i] = x[xRow + j];
      }
      fdct(xt, 0, bc, br, tmp);
      for (let i = 0; i < br; i++) {
        for (let l = 0; l < bc; l++) t[i * bc + l] = xt[l * br + i];
      }
      fdct(t, 0, br, bc, tmp);
      for (let k = 0; k < br; k++) {
        for (let l = 0; l < bc; l++) out[o + k * bc + l] = t[k * bc + l] * sr[k] * sc[l];
      }
      o += br * bc;
    }
  }
  return out;
}

const scaleCache = new Map<number, Float64Array>();

/** s_k of size n: √(1/n) for k = 0, √(2/n) otherwise (unnormalised DCT → orthonormal). */
function scales(n: number): Float64Array {
  let s = scaleCache.get(n);
  if (s === undefined) {
    s = new Float64Array(n).fill(Math.sqrt(2 / n));
    s[0] = Math.sqrt(1 / n);
    scaleCache.set(n, s);
  }
  return s;
}

const leeCache: Float64Array[] = []; // by size: an array index, not a Map lookup, on this hot path

/** Lee's factors of an even size n: 1 / (2 cos(π (2i + 1) / 2n)) for i < n/2. */
function leeFactors(n: number): Float64Array {
  let f = leeCache[n];
  if (f === undefined) {
    f = new Float64Array(n / 2).map((_, i) => 1 / (2 * Math.cos((Math.PI * (2 * i + 1)) / (2 * n))));
    leeCache[n] = f;
  }
  return f;
}

/**
 * In place, the unnormalised DCT-II X_k = Σ_i v_i cos(π (2i + 1) k / 2n) of m vectors at once:
 * rows [a, a + n) of the row-major [·, m] matrix v, transformed down each of its m columns
 * (tmp, the same size, is scratch). Even n splits as Lee (1984): with a_i = v_i + v_{n−1−i} and
 * b_i = (v_i − v_{n−1−i}) / (2 cos(π (2i + 1) / 2n)), X_{2k} = DCT(a)_k and
 * X_{2k+1} = DCT(b)_k + DCT(b)_{k+1}: O(n log n) for powers of two. Odd n is summed directly.
 */
function fdct(v: Float64Array, a: number, n: number, m: number, tmp: Float64Array): void {
  if (n & 1) {
    if (n > 1) oddDct(v, a, n, m, tmp);
    return;
  }
  const h = n >> 1;
  const f = leeFactors(n);
  for (let i = 0; i < h; i++) {
    const p = (a + i) * m;
    const q = (a + n - 1 - i) * m;
    const d = (a + h + i) * m;
    const fi = f[i];
    for (let u = 0; u < m; u++) {
      const x = v[p + u];
      const y = v[q + u];
      tmp[p + u] = x + y;
      tmp[d + u] = (x - y) * fi;
    }
  }
  fdct(tmp, a, h, m, v);
  fdct(tmp, a + h, h, m, v);
  for (let k = 0; k < h; k++) {
    const even = (a + 2 * k) * m;
    const odd = even + m;
    const lo = (a + k) * m;
    const hi = (a + h + k) * m;
    if (k < h - 1) for (let u = 0; u < m; u++) v[odd + u] = tmp[hi + u] + tmp[hi + m + u];
    else for (let u = 0; u < m; u++) v[odd + u] = tmp[hi + u];
    for (let u = 0; u < m; u++) v[even + u] = tmp[lo + u];
  }
}

/** fdct of an odd size, summed directly against the basis (unscaled). */
function oddDct(v: Float64Array, a: number, n: number, m: number, tmp: Float64Array): void {
  const d = dctBasis(n);
  const s = scales(n);
  tmp.set(v.subarray(a * m, (a + n) * m), a * m);
  for (let k = 0; k < n; k++) {
    const row = (a + k) * m;
    v.fill(0, row, row + m);
    for (let i = 0; i < n; i++) {
      const w = d[k * n + i] / s[k];
      const src = (a + i) * m;
      for (let u = 0; u < m; u++) v[row + u] += w * tmp[src + u];
    }
  }
}

/** Inverse of dctBlocks: coefficients block by block back to a row-major [rows, cols] matrix. */
export function idctBlocks(y: Float32Array, rows: number, cols: number, br: number, bc: number): Float32Array {
  checkLayout(y.length, rows, cols, br, bc);
  const size = br * bc;
  const indices = new Uint16Array(size).map((_, i) => i);
  const out = new Float32Array(rows * cols);
  const sparse = new SparseIdct(rows, cols, br, bc);
  for (let b = 0; b < y.length / size; b++) sparse.block(out, b, indices, y.subarray(b * size, (b + 1) * size), 0, size);
  return out;
}

/**
 * The inverse DCT of blocks given as a few (index, value) pairs each: X = D_rᵀ · S · D_c.
 * T = S · D_c is formed for the rows of S that hold a value only; then output rows i and
 * br − 1 − i come together as E ± O, the sums over the even and the odd touched rows of T
 * (the basis symmetry again). Cost k·bc + rows·br·bc / 2 per block. Used for both the dense
 * inverse and the decompression of top-k gradients.
 */
export class SparseIdct {
  private readonly dr: Float64Array;
  private readonly dc: Float64Array;
  private readonly t: Float64Array; // S · D_c, only the touched rows, [br, bc]
  private readonly even: Int32Array; // touched rows of S with an even index, ascending
  private readonly odd: Int32Array; // and with an odd index
  private readonly e: Float64Array; // one output row's even part
  private readonly o: Float64Array; // and its odd part

  constructor(
    private readonly rows: number,
    private readonly cols: number,
    private readonly br: number,
    private readonly bc: number,
  ) {
    this.dr = dctBasis(br);
    this.dc = dctBasis(bc);
    this.t = new Float64Array(br * bc);
    this.even = new Int32Array(br);
    this.odd = new Int32Array(br);
    this.e = new Float64Array(bc);
    this.o = new Float64Array(bc);
  }

  /**
   * Writes (overwrites) block `b` of the row-major matrix `out` from the `n` pairs
   * (indices[at + j], values[at + j]); indices lie inside the block and are strictly ascending.
   */
  block(out: Float32Array, b: number, indices: Uint16Array, values: Float32Array, at: number, n: number): void {
    const { br, bc, dc, t, even, odd } = this;
    const gridCols = this.cols / bc;
    const r0 = Math.floor(b / gridCols) * br;
    const c0 = (b % gridCols) * bc;
    if (r0 + br > this.rows) throw new InvalidArgumentError(`block ${b} lies outside the matrix`);
    let evens = 0;
    let odds = 0;
    let last = -1;
    for (let j = 0; j < n; j++) {
      const idx = indices[at + j];
      const k = Math.floor(idx / bc);
      const l = idx - k * bc;
      if (k !== last) {
        if (k & 1) odd[odds++] = k;
        else even[evens++] = k;
        t.fill(0, k * bc, (k + 1) * bc);
        last = k;
      }
      const v = values[at + j];
      const tRow = k * bc;
      const dRow = l * bc;
      for (let m = 0; m < bc; m++) t[tRow + m] += v * dc[dRow + m];
    }
    const h = br >> 1;
    for (let i = 0; i < h; i++) {
      this.combine(even, evens, i, this.e);
      this.combine(odd, odds, i, this.o);
      const top = (r0 + i) * this.cols + c0;
      const bottom = (r0 + br - 1 - i) * this.cols + c0;
      for (let m = 0; m < bc; m++) {
        out[top + m] = this.e[m] + this.o[m];
        out[bottom + m] = this.e[m] - this.o[m];
      }
    }
    if (br & 1) {
      this.combine(even, evens, h, this.e);
      out.set(this.e, (r0 + h) * this.cols + c0);
    }
  }

  /** acc = Σ_u D_r[rows[u]][i] · T[rows[u]] over the first `count` rows, four rows per pass over acc. */
  private combine(rows: Int32Array, count: number, i: number, acc: Float64Array): void {
    const { br, bc, dr, t } = this;
    acc.fill(0);
    let u = 0;
    for (; u + 3 < count; u += 4) {
      const t0 = rows[u] * bc;
      const t1 = rows[u + 1] * bc;
      const t2 = rows[u + 2] * bc;
      const t3 = rows[u + 3] * bc;
      const w0 = dr[rows[u] * br + i];
      const w1 = dr[rows[u + 1] * br + i];
      const w2 = dr[rows[u + 2] * br + i];
      const w3 = dr[rows[u + 3] * br + i];
      for (let m = 0; m < bc; m++) acc[m] += w0 * t[t0 + m] + w1 * t[t1 + m] + (w2 * t[t2 + m] + w3 * t[t3 + m]);
    }
    for (; u < count; u++) {
      const w = dr[rows[u] * br + i];
      const tRow = rows[u] * bc;
      for (let m = 0; m < bc; m++) acc[m] += w * t[tRow + m];
    }
  }
}
