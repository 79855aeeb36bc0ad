import { normalizeDim } from '../../../shape.ts';
import { type GraphBuilder, GraphValue, refuse } from '../builder.ts';
import type { LoweringTable } from '../lowerings.ts';

/**
 * Reductions: sum, mean and max over dims (or all), with keepdim; argmax (int32, as the
 * engine gives it: a Cast of ONNX's int64 ArgMax); sumTo (a broadcast gradient summed back
 * to a shape). At opset 17 ReduceSum takes its axes as an input, ReduceMean and ReduceMax as
 * an attribute.
 */

/** A tensor argument, or a refusal naming what came instead. */
function value(x: unknown, op: string): GraphValue {
  return x instanceof GraphValue ? x : refuse(`${op} of something else than a tensor`);
}

/** A boolean argument, `fallback` when it was left out. */
function flag(x: unknown, fallback: boolean, op: string): boolean {
  if (x === undefined) return fallback;
  return typeof x === 'boolean' ? x : refuse(`${op} with keepdim ${String(x)}`);
}

/** The dims reduced, sorted and distinct (all of them when `dim` is left out), as the engine's dimsOf. */
function dimsOf(x: GraphValue, dim: unknown, op: string): number[] {
  if (dim === undefined) return x.shape.map((_, i) => i);
  const list = Array.isArray(dim) ? (dim as unknown[]) : [dim];
  if (!list.every((d): d is number => typeof d === 'number' && Number.isInteger(d))) return refuse(`${op} over dims ${String(dim)}`);
  return [...new Set(list.map((d) => normalizeDim(d, x.rank)))].sort((p, q) => p - q);
}

function reducedShape(shape: readonly number[], dims: readonly number[], keepdim: boolean): number[] {
  const out: number[] = [];
  shape.forEach((d, i) => {
    if (!dims.includes(i)) out.push(d);
    else if (keepdim) out.push(1);
  });
  return out;
}

/** ReduceSum (axes as an input) or ReduceMean/ReduceMax (axes as an attribute) over `dims`; no dims: `x` itself. */
function reduce(g: GraphBuilder, op: 'ReduceSum' | 'ReduceMean' | 'ReduceMax', x: GraphValue, dims: number[], keepdim: boolean): GraphValue {
  const shape = reducedShape(x.shape, dims, keepdim);
  if (dims.length === 0) return x;
  // A reduction over dims of size 1 only moves no data: a Reshape.
  if (dims.every((d) => x.shape[d] === 1)) return g.reshape(x, shape);
  const keepdims = keepdim ? 1 : 0;
  if (op === 'ReduceSum') return g.node(op, [x, g.ints(dims)], { shape, type: x.type }, { keepdims });
  return g.node(op, [x], { shape, type: x.type }, { axes: dims, keepdims });
}

function sum(g: GraphBuilder, x: unknown, dim?: unknown, keepdim?: unknown): GraphValue {
  const v = value(x, 'sum');
  return reduce(g, 'ReduceSum', v, dimsOf(v, dim, 'sum'), flag(keepdim, false, 'sum'));
}

function mean(g: GraphBuilder, x: unknown, dim?: unknown, keepdim?: unknown): GraphValue {
  const v = value(x, 'mean');
  if (v.type !== 'float32') refuse(`mean of ${v.type}`);
  return reduce(g, 'ReduceMean', v, dimsOf(v, dim, 'mean'), flag(keepdim, false, 'mean'));
}

/** Max values only (the engine's max returns no indices); of all elements, a scalar whatever keepdim says. */
function max(g: GraphBuilder, x: unknown, dim?: unknown, keepdim?: unknown): GraphValue {
  const v = value(x, 'max');
  if (dim === undefined) {
    if (v.size === 0) refuse('max of an empty tensor');
    return g.reshape(reduce(g, 'ReduceMax', v, v.shape.map((_, i) => i), true), []);
  }
  if (typeof dim !== 'number') return refuse(`max over dim ${String(dim)}`);
  return reduce(g, 'ReduceMax', v, [normalizeDim(dim, v.rank)], flag(keepdim, false, 'max'));
}

function argmax(g: GraphBuilder, x: unknown, dim?: unknown, keepdim?: unknown): GraphValue {
  const v = value(x, 'argmax');
  if (dim !== undefined && typeof dim !== 'number') refuse(`argmax over dim ${String(dim)}`);
  const d = normalizeDim(dim ?? -1, v.rank);
  const keep = flag(keepdim, false, 'argmax');
  const shape = reducedShape(v.shape, [d], keep);
  const arg = g.node('ArgMax', [v], { shape, type: 'int64' }, { axis: d, keepdims: keep ? 1 : 0, select_last_index: 0 });
  return g.cast(arg, 'int32');
}

/** Sums the leading dims and the dims `shape` has as 1, then takes `shape` (as the engine's sumTo). */
function sumTo(g: GraphBuilder, x: unknown, shape: unknown): GraphValue {
  const v = value(x, 'sumTo');
  if (!Array.isArray(shape) || !shape.every((d) => typeof d === 'number')) return refuse('sumTo of something else than a shape');
  const target = shape as number[];
  if (v.rank === target.length && v.shape.every((d, i) => d === target[i])) return v;
  const lead = v.rank - target.length;
  if (lead < 0) refuse(`sumTo of [${v.shape}] to [${target}]`);
  const dims: number[] = [];
  for (let i = 0; i < v.rank; i++) {
    if (i < lead || (target[i - lead] === 1 && v.shape[i] !== 1)) dims.push(i);
  }
  const summed = reduce(g, 'ReduceSum', v, dims, true);
  if (summed.size !== target.reduce((a, d) => a * d, 1)) refuse(`sumTo of [${v.shape}] to [${target}]`);
  return g.reshape(summed, target);
}

export const REDUCTIONS: LoweringTable = { sum, mean, max, argmax, sumTo };
