import { normalizeDim, resolveShape, sizeOf } from '../../../shape.ts';
import { type GraphBuilder, GraphValue, refuse } from '../builder.ts';
import type { LoweringTable } from '../lowerings.ts';

/**
 * Shape ops: reshape (and view, which records it), flatten, unsqueeze, squeeze, permute,
 * transpose, narrow, cat, split, expand, indexSelect and gather. Reshapes are Reshape nodes
 * (a no-op when the shape is unchanged); everything that moves data is the ONNX op that
 * moves it the same way (Transpose, Slice, Concat, Split, Expand, Gather, GatherElements).
 * `contiguous()` records nothing (tensors are always contiguous), so it needs no lowering.
 */

/** A tensor argument, or a refusal naming what came instead. */
function value(x: unknown, op: string): GraphValue {
  return x instanceof GraphValue ? x : refuse(`${op} of something else than a tensor`);
}

/** A number argument, `fallback` when it was left out (trailing undefined arguments are dropped from the trace). */
function int(x: unknown, fallback: number, op: string): number {
  if (x === undefined) return fallback;
  return typeof x === 'number' && Number.isInteger(x) ? x : refuse(`${op} with a non-integer argument ${String(x)}`);
}

/** A list of integers argument (a shape, a permutation). */
function ints(x: unknown, op: string): number[] {
  if (Array.isArray(x) && x.every((d) => typeof d === 'number' && Number.isInteger(d))) return x as number[];
  return refuse(`${op} of something else than a list of integers`);
}

/** `length` elements of `x` from `start` along axis `d` (a Slice). */
function slice(g: GraphBuilder, x: GraphValue, d: number, start: number, length: number): GraphValue {
  if (start === 0 && length === x.shape[d]) return x;
  const shape = [...x.shape];
  shape[d] = length;
  return g.node('Slice', [x, g.ints([start]), g.ints([start + length]), g.ints([d])], { shape, type: x.type });
}

function reshape(g: GraphBuilder, x: unknown, shape: unknown): GraphValue {
  const v = value(x, 'reshape');
  return g.reshape(v, resolveShape(ints(shape, 'reshape'), v.size));
}

function flatten(g: GraphBuilder, x: unknown, startDim?: unknown, endDim?: unknown): GraphValue {
  const v = value(x, 'flatten');
  if (v.rank === 0) return g.reshape(v, [1]);
  const s = normalizeDim(int(startDim, 0, 'flatten'), v.rank);
  const e = normalizeDim(int(endDim, -1, 'flatten'), v.rank);
  return g.reshape(v, [...v.shape.slice(0, s), sizeOf(v.shape.slice(s, e + 1)), ...v.shape.slice(e + 1)]);
}

function unsqueeze(g: GraphBuilder, x: unknown, dim: unknown): GraphValue {
  const v = value(x, 'unsqueeze');
  const d = normalizeDim(int(dim, 0, 'unsqueeze'), v.rank + 1);
  return g.reshape(v, [...v.shape.slice(0, d), 1, ...v.shape.slice(d)]);
}

function squeeze(g: GraphBuilder, x: unknown, dim?: unknown): GraphValue {
  const v = value(x, 'squeeze');
  if (dim === undefined) return g.reshape(v, v.shape.filter((d) => d !== 1));
  const d = normalizeDim(int(dim, 0, 'squeeze'), v.rank);
  if (v.shape[d] !== 1) return v;
  return g.reshape(v, [...v.shape.slice(0, d), ...v.shape.slice(d + 1)]);
}

function permute(g: GraphBuilder, x: unknown, dims: unknown): GraphValue {
  const v = value(x, 'permute');
  const list = ints(dims, 'permute');
  if (list.length !== v.rank) refuse(`permute of rank ${v.rank} by ${list.length} dims`);
  const perm = list.map((d) => normalizeDim(d, v.rank));
  if (new Set(perm).size !== perm.length) refuse(`permute dims [${list}] repeat`);
  if (perm.every((p, i) => p === i)) return v;
  // A permutation that only moves size-1 dims keeps the element order: a Reshape.
  const moved = perm.filter((p) => v.shape[p] !== 1);
  const shape = perm.map((p) => v.shape[p]);
  if (moved.every((p, i) => i === 0 || p > moved[i - 1])) return g.reshape(v, shape);
  return g.node('Transpose', [v], { shape, type: v.type }, { perm });
}

function transpose(g: GraphBuilder, x: unknown, dim0: unknown, dim1: unknown): GraphValue {
  const v = value(x, 'transpose');
  const perm = v.shape.map((_, i) => i);
  const a = normalizeDim(int(dim0, 0, 'transpose'), v.rank);
  const b = normalizeDim(int(dim1, 0, 'transpose'), v.rank);
  [perm[a], perm[b]] = [perm[b], perm[a]];
  return permute(g, v, perm);
}

function narrow(g: GraphBuilder, x: unknown, dim: unknown, start: unknown, length: unknown): GraphValue {
  const v = value(x, 'narrow');
  const d = normalizeDim(int(dim, 0, 'narrow'), v.rank);
  const s0 = int(start, 0, 'narrow');
  const s = s0 < 0 ? s0 + v.shape[d] : s0;
  const n = int(length, 0, 'narrow');
  if (s < 0 || n < 0 || s + n > v.shape[d]) refuse(`narrow(${d}, ${s0}, ${n}) is outside a dim of size ${v.shape[d]}`);
  return slice(g, v, d, s, n);
}

function cat(g: GraphBuilder, tensors: unknown, dim?: unknown): GraphValue {
  if (!Array.isArray(tensors) || tensors.length === 0) return refuse('cat of something else than a list of tensors');
  const vs = tensors.map((t) => value(t, 'cat'));
  const first = vs[0];
  const d = normalizeDim(int(dim, 0, 'cat'), first.rank);
  for (const t of vs) {
    if (t.type !== first.type) refuse('cat of tensors with different types');
    if (t.rank !== first.rank || t.shape.some((s, i) => i !== d && s !== first.shape[i])) {
      refuse(`cat along dim ${d}: shapes [${first.shape}] and [${t.shape}] differ`);
    }
  }
  if (vs.length === 1) return first;
  const shape = [...first.shape];
  shape[d] = vs.reduce((n, t) => n + t.shape[d], 0);
  return g.node('Concat', vs, { shape, type: first.type }, { axis: d });
}

function split(g: GraphBuilder, x: unknown, sizeOrSizes: unknown, dim?: unknown): GraphValue[] {
  const v = value(x, 'split');
  const d = normalizeDim(int(dim, 0, 'split'), v.rank);
  const n = v.shape[d];
  let sizes: number[];
  if (typeof sizeOrSizes === 'number') {
    const size = int(sizeOrSizes, 1, 'split');
    if (size <= 0) refuse('split size must be positive');
    sizes = [];
    for (let s = 0; s < n; s += size) sizes.push(Math.min(size, n - s));
  } else {
    sizes = ints(sizeOrSizes, 'split');
    if (sizes.reduce((a, b) => a + b, 0) !== n) refuse(`split sizes [${sizes}] do not add up to ${n}`);
  }
  if (sizes.length > 1 && sizes.every((s) => s > 0)) {
    const outs = sizes.map((s) => ({ shape: v.shape.map((e, i) => (i === d ? s : e)), type: v.type }));
    return g.multi('Split', [v, g.ints(sizes)], outs, { axis: d });
  }
  let start = 0;
  return sizes.map((len) => {
    const part = slice(g, v, d, start, len);
    start += len;
    return part;
  });
}

function expand(g: GraphBuilder, x: unknown, shape: unknown): GraphValue {
  const v = value(x, 'expand');
  const list = ints(shape, 'expand');
  const offset = list.length - v.rank;
  if (offset < 0) refuse(`cannot expand [${v.shape}] to [${list}]`);
  const target = list.map((s, i) => (s === -1 ? v.shape[i - offset] : s));
  const fits = v.shape.every((s, i) => s === 1 || s === target[i + offset]);
  if (!fits) refuse(`cannot expand [${v.shape}] to [${list}]`);
  if (v.rank === target.length && v.shape.every((s, i) => s === target[i])) return v;
  return g.node('Expand', [v, g.ints(target)], { shape: target, type: v.type });
}

/** The index as a value Gather takes (int32 or int64). */
function index(x: unknown, op: string): GraphValue {
  const i = value(x, op);
  return i.type === 'int32' || i.type === 'int64' ? i : refuse(`${op} needs an int32 index, got ${i.type}`);
}

function indexSelect(g: GraphBuilder, x: unknown, dim: unknown, idx: unknown): GraphValue {
  const v = value(x, 'indexSelect');
  const i = index(idx, 'indexSelect');
  if (i.rank !== 1) refuse('indexSelect needs a 1-D index');
  const d = normalizeDim(int(dim, 0, 'indexSelect'), v.rank);
  const shape = [...v.shape];
  shape[d] = i.shape[0];
  return g.node('Gather', [v, i], { shape, type: v.type }, { axis: d });
}

function gather(g: GraphBuilder, x: unknown, dim: unknown, idx: unknown): GraphValue {
  const v = value(x, 'gather');
  const i = index(idx, 'gather');
  if (i.rank !== v.rank) refuse('gather needs an index of the same rank');
  const d = normalizeDim(int(dim, 0, 'gather'), v.rank);
  return g.node('GatherElements', [v, i], { shape: i.shape, type: v.type }, { axis: d });
}

export const SHAPES: LoweringTable = {
  reshape,
  flatten,
  unsqueeze,
  squeeze,
  permute,
  transpose,
  narrow,
  cat,
  split,
  expand,
  indexSelect,
  gather,
};
