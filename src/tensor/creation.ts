import { InvalidArgumentError } from '../errors.ts';
import { allocate, type DType, type TypedArray } from './dtype.ts';
import { Generator } from './random.ts';
import { type Shape, sizeOf } from './shape.ts';
import { Tensor } from './tensor.ts';

type NestedNumbers = number | NestedNumbers[];

function flattenNested(values: NestedNumbers, out: number[], shape: number[], depth: number): void {
  if (typeof values === 'number') {
    out.push(values);
    return;
  }
  if (shape.length <= depth) shape.push(values.length);
  else if (shape[depth] !== values.length) throw new InvalidArgumentError('ragged nested array');
  for (const v of values) flattenNested(v, out, shape, depth + 1);
}

/**
 * Creates a tensor from numbers (flat with a shape, or nested arrays) or a typed array.
 * @example
 * const x = tensor([1, 2, 3, 4], [2, 2])
 * const ids = tensor([5, 7, 9], [1, 3], 'int32')
 */
export function tensor(
  values: NestedNumbers | ArrayLike<number> | TypedArray,
  shape?: Shape,
  dtype: DType = 'float32',
): Tensor {
  let flat: ArrayLike<number>;
  let inferred: number[] = [];
  if (typeof values === 'number') {
    flat = [values];
  } else if (Array.isArray(values) && values.some((v) => Array.isArray(v))) {
    const out: number[] = [];
    flattenNested(values as NestedNumbers, out, inferred, 0);
    flat = out;
  } else {
    flat = values as ArrayLike<number>;
    inferred = [flat.length];
  }
  const finalShape = shape ?? (typeof values === 'number' ? [] : inferred);
  const data = allocate(dtype, flat.length);
  data.set(flat);
  return new Tensor(data, finalShape);
}

export function zeros(shape: Shape, dtype: DType = 'float32'): Tensor {
  return new Tensor(allocate(dtype, sizeOf(shape)), shape);
}

export function ones(shape: Shape, dtype: DType = 'float32'): Tensor {
  return full(shape, 1, dtype);
}

export function full(shape: Shape, value: number, dtype: DType = 'float32'): Tensor {
  return new Tensor(allocate(dtype, sizeOf(shape)).fill(value), shape);
}

/** Integers start, start+step, ... below end. */
export function arange(start: number, end?: number, step = 1, dtype: DType = 'int32'): Tensor {
  const [lo, hi] = end === undefined ? [0, start] : [start, end];
  const n = Math.max(0, Math.ceil((hi - lo) / step));
  const data = allocate(dtype, n);
  for (let i = 0; i < n; i++) data[i] = lo + i * step;
  return new Tensor(data, [n]);
}

export interface RandomOptions {
  /** A generator to draw from; otherwise a fresh one seeded with `seed` (default 0). */
  generator?: Generator;
  seed?: number;
  dtype?: DType;
}

function generatorOf(options: RandomOptions): Generator {
  return options.generator ?? new Generator(options.seed ?? 0);
}

/**
 * Whether `g` draws nothing (ZeroGenerator): then random tensors are zeros left as allocated, their pages untouched, so
 * a model built to be loaded takes no memory for a weight before the checkpoint writes it, and none at all for one
 * that is held compact (quant/pack.ts).
 */
export function drawsNothing(g: Generator | undefined): boolean {
  return (g as { blank?: boolean } | undefined)?.blank === true;
}

/** Standard normal samples, the same on every machine for the same seed. */
export function randn(shape: Shape, options: RandomOptions = {}): Tensor {
  const g = generatorOf(options);
  const data = allocate(options.dtype ?? 'float32', sizeOf(shape));
  if (drawsNothing(g)) return new Tensor(data, shape);
  for (let i = 0; i < data.length; i++) data[i] = g.normal();
  return new Tensor(data, shape);
}

/** Uniform samples in [low, high). */
export function rand(shape: Shape, options: RandomOptions & { low?: number; high?: number } = {}): Tensor {
  const g = generatorOf(options);
  const low = options.low ?? 0;
  const span = (options.high ?? 1) - low;
  const data = allocate(options.dtype ?? 'float32', sizeOf(shape));
  if (drawsNothing(g)) return new Tensor(data, shape);
  for (let i = 0; i < data.length; i++) data[i] = low + span * g.uniform();
  return new Tensor(data, shape);
}

/** Uniform integers in [low, high) as int32. */
export function randint(low: number, high: number, shape: Shape, options: RandomOptions = {}): Tensor {
  const g = generatorOf(options);
  const data = new Int32Array(sizeOf(shape));
  for (let i = 0; i < data.length; i++) data[i] = low + g.int(high - low);
  return new Tensor(data, shape);
}
