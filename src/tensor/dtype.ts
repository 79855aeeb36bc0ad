import { DTypeError } from '../errors.ts';
import { takeFloat32 } from './pool.ts';

/** Element types tensors compute in. float64 exists for gradient checks and exact references. */
export type DType = 'float32' | 'float64' | 'int32';
/** Element types that only appear in storage (checkpoints, transfer frames). */
export type StorageDType = DType | 'float16' | 'bfloat16';

export type FloatArray = Float32Array | Float64Array;
export type TypedArray = FloatArray | Int32Array;

export function allocate(dtype: DType, size: number): TypedArray {
  switch (dtype) {
    case 'float32':
      return takeFloat32(size);
    case 'float64':
      return new Float64Array(size);
    case 'int32':
      return new Int32Array(size);
  }
}

export function dtypeOf(data: TypedArray): DType {
  if (data instanceof Float32Array) return 'float32';
  if (data instanceof Float64Array) return 'float64';
  return 'int32';
}

export function isFloat(dtype: DType): boolean {
  return dtype !== 'int32';
}

export function bytesPerElement(dtype: StorageDType): number {
  return dtype === 'float64' ? 8 : dtype === 'float16' || dtype === 'bfloat16' ? 2 : 4;
}

export function assertFloat(dtype: DType, op: string): void {
  if (!isFloat(dtype)) throw new DTypeError(`${op} needs a float tensor, got ${dtype}`);
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** IEEE half → float32, exact (subnormals, infinities and NaN included). */
export function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? Number.NaN : sign * Number.POSITIVE_INFINITY;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** float32 → IEEE half, rounding to nearest even (as PyTorch's `.half()`). */
export function floatToHalf(value: number): number {
  f32[0] = value;
  const x = u32[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    let r = mant >> shift;
    const rest = mant & ((1 << shift) - 1);
    if (rest > half || (rest === half && r & 1)) r++;
    return sign | r;
  }
  let r = mant >> 13;
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && r & 1)) {
    r++;
    if (r === 0x400) {
      r = 0;
      e++;
      if (e >= 31) return sign | 0x7c00;
    }
  }
  return sign | (e << 10) | r;
}

/** bfloat16 → float32, exact. */
export function bfloat16ToFloat(b: number): number {
  u32[0] = b << 16;
  return f32[0];
}

/** float32 → bfloat16, rounding to nearest even (as PyTorch's `.bfloat16()`). */
export function floatToBfloat16(value: number): number {
  f32[0] = value;
  const x = u32[0];
  if ((x & 0x7f800000) === 0x7f800000 && x & 0x7fffff) return (x >>> 16) | 0x40;
  return (x + 0x7fff + ((x >>> 16) & 1)) >>> 16;
}
