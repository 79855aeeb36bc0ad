import { readFileSync } from 'node:fs';
import { type DType, Tensor, tensor } from '../../src/tensor/index.ts';

export interface Encoded {
  shape: number[];
  dtype: 'float32' | 'int32';
  data: number[];
}

export function loadFixture<T>(name: string): T {
  return JSON.parse(readFileSync(new URL(`../fixtures/${name}`, import.meta.url), 'utf8')) as T;
}

/** Decodes a fixture tensor; float data may be widened to float64 for gradient checks. */
export function decode(e: Encoded, floatType: DType = 'float32'): Tensor {
  return tensor(e.data, e.shape, e.dtype === 'int32' ? 'int32' : floatType);
}

/** max |a − b| / max(1, max |b|): a relative error that tolerates near-zero references. */
export function relError(a: Tensor | ArrayLike<number>, b: Tensor | ArrayLike<number>): number {
  const x = a instanceof Tensor ? a.data : a;
  const y = b instanceof Tensor ? b.data : b;
  if (x.length !== y.length) return Number.POSITIVE_INFINITY;
  let err = 0;
  let scale = 1;
  for (let i = 0; i < x.length; i++) {
    err = Math.max(err, Math.abs(x[i] - y[i]));
    scale = Math.max(scale, Math.abs(y[i]));
  }
  return err / scale;
}
