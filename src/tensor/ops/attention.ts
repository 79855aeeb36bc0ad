import { ShapeMismatchError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { getBackend } from '../backends/select.ts';
import { allocate, type FloatArray } from '../dtype.ts';
import { broadcastShapes, broadcastStrides } from '../shape.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';
import { matmul } from './matmul.ts';
import { transpose } from './shape.ts';

export interface AttentionOptions {
  /** Each query attends only to keys at or before its own position. */
  causal?: boolean;
  /** int32, broadcastable to [B, H, Tq, Tk]: non-zero where a query may attend a key. */
  mask?: Tensor | null;
  /** Defaults to 1/sqrt(head dim). */
  scale?: number;
}

/**
 * Scaled dot-product attention, composed from matmul, a masked fill and softmax.
 * q is [B, H, Tq, D]; k and v are [B, H, Tk, D] and may include past keys/values
 * before the new ones (Tk ≥ Tq): the causal mask is then offset by Tk − Tq, so the
 * query at position i of the new tokens sees keys 0 .. (Tk − Tq + i).
 */
export function scaledDotProductAttention(
  q: Tensor,
  k: Tensor,
  v: Tensor,
  options: AttentionOptions = {},
): Tensor {
  if (hooked) return hook('scaledDotProductAttention', scaledDotProductAttention, [q, k, v, options]);
  if (q.ndim !== 4 || k.ndim !== 4 || v.ndim !== 4) {
    throw new ShapeMismatchError('attention expects q, k, v of rank 4: [batch, heads, time, head dim]');
  }
  const scale = options.scale ?? 1 / Math.sqrt(q.shape[3]);
  const scores = matmul(q, transpose(k, -2, -1)); // [B, H, Tq, Tk]
  const p = maskedSoftmax(scores, scale, options.causal ?? false, options.mask ?? null);
  return matmul(p, v); // [B, H, Tq, Dv]
}

/**
 * softmax(scale · scores) over the last dim with the causal and user masks applied in the
 * same pass: a blocked key gets probability 0 (a row with every key blocked is all zeros).
 * Fusing the scale, both masks and the softmax saves three passes and three buffers per
 * attention layer (measured in bench/run.ts, GPT-2 forward). VJP: dx = scale · y ⊙ (g − Σ g⊙y).
 */
export function maskedSoftmax(scores: Tensor, scale: number, causal: boolean, mask: Tensor | null): Tensor {
  if (hooked) return hook('maskedSoftmax', maskedSoftmax, [scores, scale, causal, mask]);
  const [b, h, tq, tk] = scores.shape;
  const offset = tk - tq;
  let maskData: Int32Array | null = null;
  let ms: number[] = [];
  if (mask) {
    const full = broadcastShapes(scores.shape, mask.shape);
    if (full.some((d, i) => d !== scores.shape[i])) {
      throw new ShapeMismatchError(`attention mask [${mask.shape}] does not broadcast to scores [${scores.shape}]`);
    }
    maskData = mask.data as Int32Array;
    ms = broadcastStrides(mask.shape, scores.shape);
  }
  const x = scores.data;
  const y = allocate(scores.dtype, scores.size);
  const allowed = new Uint8Array(tk);
  const native = maskData === null && getBackend().softmax?.(x as FloatArray, y as FloatArray, b * h, tq, tk, scale, causal) === true;
  for (let bi = 0; bi < b && !native; bi++) {
    for (let hi = 0; hi < h; hi++) {
      for (let i = 0; i < tq; i++) {
        const row = ((bi * h + hi) * tq + i) * tk;
        const last = causal ? Math.min(tk - 1, i + offset) : tk - 1;
        const mrow = maskData ? bi * ms[0] + hi * ms[1] + i * ms[2] : 0;
        let mx = Number.NEGATIVE_INFINITY;
        for (let j = 0; j <= last; j++) {
          const ok = maskData === null || maskData[mrow + j * ms[3]] !== 0;
          allowed[j] = ok ? 1 : 0;
          if (ok) mx = Math.max(mx, x[row + j]);
        }
        if (mx === Number.NEGATIVE_INFINITY) continue; // nothing to attend to: zeros
        let total = 0;
        for (let j = 0; j <= last; j++) {
          if (!allowed[j]) continue;
          const e = Math.exp(scale * (x[row + j] - mx));
          y[row + j] = e;
          total += e;
        }
        const inv = 1 / total;
        for (let j = 0; j <= last; j++) y[row + j] *= inv;
      }
    }
  }
  return record(new Tensor(y, scores.shape), 'maskedSoftmax', [scores], (g) => {
    const gx = allocate(scores.dtype, scores.size);
    const gd = g.data;
    for (let r = 0; r < b * h * tq; r++) {
      const row = r * tk;
      const i = r % tq;
      const last = causal ? Math.min(tk - 1, i + offset) : tk - 1;
      let dot = 0;
      for (let j = 0; j <= last; j++) dot += gd[row + j] * y[row + j];
      for (let j = 0; j <= last; j++) gx[row + j] = scale * y[row + j] * (gd[row + j] - dot);
    }
    return [new Tensor(gx, scores.shape)];
  });
}

/** The sizes of one sequence's attention over time-major keys and values (see attendTimeMajor). */
export interface TimeMajorAttentionSpec {
  /** Query heads; each run of heads / kvHeads consecutive query heads shares one key head. */
  heads: number;
  kvHeads: number;
  tq: number;
  tk: number;
  dim: number;
  scale: number;
}

/**
 * Keys and values held time-major, as a KV cache that grows in place keeps them: `k` and `v` are [B, capacity,
 * kvHeads, D], of which positions [0, length) are filled (the rest is room to grow).
 */
export interface TimeMajorKV {
  k: Float32Array;
  v: Float32Array;
  capacity: number;
  length: number;
  kvHeads: number;
}

/**
 * One sequence's keys and values in fixed-size pages, as a paged KV cache keeps them: page i holds positions
 * [i·pageSize, (i + 1)·pageSize), each page time-major [pageSize, kvHeads, D]; positions [0, length) are filled.
 */
export interface PagedTimeMajorKV {
  kPages: readonly Float32Array[];
  vPages: readonly Float32Array[];
  pageSize: number;
  length: number;
  kvHeads: number;
}

/**
 * Causal attention of q [B, H, Tq, D] over keys and values held time-major (TimeMajorKV, Tk = its length ≥ Tq, the
 * queries the last Tq positions), each key head shared by H / kvHeads consecutive query heads: [B, H, Tq, D]. It is
 * scaledDotProductAttention(q, repeatKv(k), repeatKv(v), { causal: true, scale }) without the repeated, transposed
 * and concatenated copies of the keys and values that path makes at every decoding step. On the js kernel it is
 * bitwise that path: each score and each output is the same double-precision sum taken in the same order (a key a
 * query may not see adds only zeros there, and is skipped here), and the softmax is maskedSoftmax's. Keys in pages
 * (PagedTimeMajorKV, one sequence) give the same sums: the js kernel reads them where they lie, a backend's kernel gets
 * them gathered. Not differentiable: a cache's keys are detached, so callers take it without gradients.
 */
export function attendTimeMajor(q: Tensor, kv: TimeMajorKV | PagedTimeMajorKV, scale?: number): Tensor {
  if (hooked) return hook('attendTimeMajor', attendTimeMajor, [q, kv, scale]);
  const [b, heads, tq, dim] = q.shape;
  if (q.ndim !== 4 || q.dtype !== 'float32') throw new ShapeMismatchError(`attention expects float32 q [batch, heads, time, head dim], got ${q.dtype} [${q.shape}]`);
  const tk = kv.length;
  const kvHeads = kv.kvHeads;
  const fits = 'kPages' in kv
    ? b === 1 && kv.kPages.length * kv.pageSize >= tk
    && kv.kPages.every((p, i) => p.length === kv.pageSize * kvHeads * dim && kv.vPages[i]?.length === p.length)
    : kv.k.length === b * kv.capacity * kvHeads * dim && kv.v.length === kv.k.length;
  if (heads % kvHeads !== 0 || tk < tq || !fits) {
    throw new ShapeMismatchError(`attention of q [${q.shape}] over ${tk} cached positions of ${kvHeads} key heads does not fit`);
  }
  const spec: TimeMajorAttentionSpec = { heads, kvHeads, tq, tk, dim, scale: scale ?? 1 / Math.sqrt(dim) };
  const out = new Float32Array(q.size);
  const backend = getBackend();
  if ('kPages' in kv) {
    const qb = q.data as Float32Array;
    const pages = { k: kv.kPages, v: kv.vPages, size: kv.pageSize };
    const n = tk * kvHeads * dim;
    const whole = (ps: readonly Float32Array[]) => {
      if (ps.length === 0) return new Float32Array(0);
      return tk <= kv.pageSize ? ps[0].subarray(0, n) : gather(ps, n);
    };
    if (backend.attention?.(qb, whole(pages.k), whole(pages.v), out, spec) !== true) attendPagedJs(qb, pages, out, spec);
    return new Tensor(out, q.shape);
  }
  const rows = heads * tq * dim;
  const seq = kv.capacity * kvHeads * dim;
  for (let bi = 0; bi < b; bi++) {
    const qb = (q.data as Float32Array).subarray(bi * rows, (bi + 1) * rows);
    const kb = kv.k.subarray(bi * seq, bi * seq + tk * kvHeads * dim);
    const vb = kv.v.subarray(bi * seq, bi * seq + tk * kvHeads * dim);
    const yb = out.subarray(bi * rows, (bi + 1) * rows);
    if (backend.attention?.(qb, kb, vb, yb, spec) !== true) attendTimeMajorJs(qb, kb, vb, yb, spec);
  }
  return new Tensor(out, q.shape);
}

/** The first `n` values of pages laid end to end, as one array (what a backend's kernel reads). */
function gather(pages: readonly Float32Array[], n: number): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0, at = 0; at < n; i++, at += pages[i - 1].length) out.set(pages[i].subarray(0, Math.min(pages[i].length, n - at)), at);
  return out;
}

/**
 * The js kernel of attendTimeMajor for one sequence: q, y [H, Tq, D], k, v [Tk, kvHeads, D]. Scores and outputs are
 * gemmNN's sums (double precision, in increasing order, rounded once to float32), the softmax maskedSoftmax's.
 */
export function attendTimeMajorJs(q: Float32Array, k: Float32Array, v: Float32Array, y: Float32Array, spec: TimeMajorAttentionSpec): void {
  attendPagedJs(q, { k: [k], v: [v], size: Math.max(spec.tk, 1) }, y, spec);
}

/** attendTimeMajorJs over keys and values in pages of `size` positions each [size, kvHeads, D]: the same sums. */
function attendPagedJs(
  q: Float32Array,
  pages: { k: readonly Float32Array[]; v: readonly Float32Array[]; size: number },
  y: Float32Array,
  spec: TimeMajorAttentionSpec,
): void {
  const { heads, kvHeads, tq, tk, dim, scale } = spec;
  const groups = heads / kvHeads;
  const step = kvHeads * dim;
  const size = pages.size;
  const p = new Float32Array(tk);
  const acc = new Float64Array(dim);
  for (let h = 0; h < heads; h++) {
    const kh = Math.floor(h / groups) * dim;
    for (let i = 0; i < tq; i++) {
      const row = (h * tq + i) * dim;
      const last = i + tk - tq;
      let mx = Number.NEGATIVE_INFINITY;
      // the page a position lies in, and where that page begins, followed as j grows (no division per key)
      let page = 0;
      let start = 0;
      let k = pages.k[0];
      for (let j = 0; j <= last; j++) {
        if (j - start === size) {
          k = pages.k[++page];
          start += size;
        }
        const ko = (j - start) * step + kh;
        let s = 0;
        for (let d = 0; d < dim; d++) s += q[row + d] * k[ko + d];
        p[j] = s; // the score as the product's float32 output holds it
        mx = Math.max(mx, p[j]);
      }
      if (mx === Number.NEGATIVE_INFINITY) {
        y.fill(0, row, row + dim); // nothing to attend to: zeros
        continue;
      }
      let total = 0;
      for (let j = 0; j <= last; j++) {
        const e = Math.exp(scale * (p[j] - mx));
        p[j] = e;
        total += e;
      }
      const inv = 1 / total;
      for (let j = 0; j <= last; j++) p[j] *= inv;
      acc.fill(0);
      page = 0;
      start = 0;
      let v = pages.v[0];
      for (let j = 0; j <= last; j++) {
        if (j - start === size) {
          v = pages.v[++page];
          start += size;
        }
        const pj = p[j];
        const vo = (j - start) * step + kh;
        for (let d = 0; d < dim; d++) acc[d] += pj * v[vo + d];
      }
      for (let d = 0; d < dim; d++) y[row + d] = acc[d];
    }
  }
}
