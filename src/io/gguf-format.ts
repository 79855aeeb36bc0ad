import { GGUFFormatError } from '../errors.ts';
import { READ_CHUNK_BYTES } from './read-file.ts';
import { bfloat16ToFloat, floatToBfloat16, floatToHalf, halfToFloat, type PackedMatrix } from '../tensor/index.ts';

/**
 * GGUF v3, the file format of llama.cpp and Ollama: the pure parts (value and tensor types, block sizes, and the
 * codecs between GGUF's blocks and float32 or our PackedMatrix). gguf.ts reads and writes files with them.
 *
 * Layout (all little-endian): "GGUF", u32 version (3), u64 tensor count, u64 metadata count; each metadata entry a
 * string key (u64 length + UTF-8), a u32 value type and the value (an array: u32 item type, u64 count, items); each
 * tensor a string name, u32 n_dims, u64 ne[n_dims] (fastest-varying first: a PyTorch [rows, cols] matrix has
 * ne = [cols, rows]), u32 ggml type and u64 offset from the data section; then padding to `general.alignment`
 * (default 32) and the data section, every tensor's offset a multiple of the alignment.
 *
 * Blocks (ggml-common.h): Q8_0 = f16 d, i8 qs[32] (w = q·d); Q4_0 = f16 d, u8 qs[16] with element j in the low
 * nibble of byte j and element j + 16 in its high nibble (w = (q − 8)·d); Q4_K (256 weights) = f16 d, f16 dmin,
 * u8 scales[12] (eight 6-bit scales and mins), u8 qs[128]; Q6_K (256) = u8 ql[128], u8 qh[64], i8 scales[16], f16 d.
 */

export { GGUFFormatError };

export const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
export const GGUF_VERSION = 3;
export const GGUF_DEFAULT_ALIGNMENT = 32;
/** ggml's GGML_MAX_DIMS. */
export const MAX_DIMS = 4;
/** Bytes read or encoded per step: bounds the temporary memory of a load or a write. */
export const CHUNK_BYTES = READ_CHUNK_BYTES;

/** Metadata value types, by their ids in the file. */
export const GGUF_VALUE_TYPES = [
  'uint8', 'int8', 'uint16', 'int16', 'uint32', 'int32', 'float32', 'bool', 'string', 'array', 'uint64', 'int64', 'float64',
] as const;
export type GGUFValueType = (typeof GGUF_VALUE_TYPES)[number];
export type GGUFScalarType = Exclude<GGUFValueType, 'array'>;
/** uint64 and int64 as bigint; the other numeric types as number. */
export type GGUFScalar = number | bigint | boolean | string;
/** One metadata value with its type (the type is kept so that a file read and written again is the same). */
export type GGUFValue = { type: GGUFScalarType; value: GGUFScalar } | { type: 'array'; itemType: GGUFScalarType; value: GGUFScalar[] };

/** Typed metadata values for writing: `{ 'llama.block_count': GGUFMeta.u32(4) }`. */
export const GGUFMeta = {
  u8: (value: number): GGUFValue => ({ type: 'uint8', value }),
  u32: (value: number): GGUFValue => ({ type: 'uint32', value }),
  i32: (value: number): GGUFValue => ({ type: 'int32', value }),
  u64: (value: number | bigint): GGUFValue => ({ type: 'uint64', value: BigInt(value) }),
  f32: (value: number): GGUFValue => ({ type: 'float32', value }),
  f64: (value: number): GGUFValue => ({ type: 'float64', value }),
  bool: (value: boolean): GGUFValue => ({ type: 'bool', value }),
  str: (value: string): GGUFValue => ({ type: 'string', value }),
  array: (itemType: GGUFScalarType, value: GGUFScalar[]): GGUFValue => ({ type: 'array', itemType, value }),
};

/** The tensor types this reader reads (and, F32/F16/BF16/Q8_0/Q4_0, writes). */
export const GGML_TYPES = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 8, Q4_K: 12, Q6_K: 14, BF16: 30 } as const;
export type GGMLType = keyof typeof GGML_TYPES;
/** The types a GGUF file can be written in. */
export const GGUF_WRITE_TYPES = ['F32', 'F16', 'BF16', 'Q8_0', 'Q4_0'] as const;
export type GGUFWriteType = (typeof GGUF_WRITE_TYPES)[number];

/** Names of ggml's other types, for the message that refuses them. */
const OTHER_GGML_TYPES: Record<number, string> = {
  3: 'Q4_1', 6: 'Q5_0', 7: 'Q5_1', 9: 'Q8_1', 10: 'Q2_K', 11: 'Q3_K', 13: 'Q5_K', 15: 'Q8_K', 16: 'IQ2_XXS', 17: 'IQ2_XS',
  18: 'IQ3_XXS', 19: 'IQ1_S', 20: 'IQ4_NL', 21: 'IQ3_S', 22: 'IQ2_S', 23: 'IQ4_XS', 24: 'I8', 25: 'I16', 26: 'I32', 27: 'I64',
  28: 'F64', 29: 'IQ1_M', 34: 'TQ1_0', 35: 'TQ2_0', 39: 'MXFP4',
};

/** The type of a ggml type id, or its name (or number) when this reader does not support it. */
export function ggmlTypeOf(id: number): GGMLType | { unsupported: string } {
  const found = (Object.keys(GGML_TYPES) as GGMLType[]).find((t) => GGML_TYPES[t] === id);
  return found ?? { unsupported: OTHER_GGML_TYPES[id] ?? `type ${id}` };
}

/** Weights per block and bytes per block of each type. */
export const GGML_BLOCK: Record<GGMLType, { size: number; bytes: number }> = {
  F32: { size: 1, bytes: 4 },
  F16: { size: 1, bytes: 2 },
  BF16: { size: 1, bytes: 2 },
  Q8_0: { size: 32, bytes: 34 },
  Q4_0: { size: 32, bytes: 18 },
  Q4_K: { size: 256, bytes: 144 },
  Q6_K: { size: 256, bytes: 210 },
};

/** Bytes of a tensor of `count` weights whose rows are `rowLength` long; throws when the rows do not fill whole blocks. */
export function ggmlBytes(type: GGMLType, rowLength: number, count: number, where: string): number {
  const { size, bytes } = GGML_BLOCK[type];
  if (rowLength % size !== 0) throw new GGUFFormatError(`${where}: ${type} needs rows of a multiple of ${size} weights, its rows have ${rowLength}`);
  return (count / size) * bytes;
}

const f32 = Math.fround;
/** A little-endian machine reads F32 data as it is in memory (no conversion). */
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
/** A float16 scale as float32, −0 as +0 (our packing's convention: a zero scale is +0). */
const scaleOf = (bits: number) => halfToFloat(bits) || 0;

/**
 * Decodes `count` weights of `type` from `src` (whole blocks) into `out[at…]` as float32: F16/BF16 widened, Q8_0 and
 * Q4_0 as q·d, Q4_K and Q6_K as llama.cpp's dequantize_row_q4_K / dequantize_row_q6_K compute them in float32 (every
 * product there is exact in float32, so a fused multiply-add in a build of llama.cpp gives the same values).
 */
export function decodeBlocks(type: GGMLType, src: Uint8Array, count: number, out: Float32Array, at = 0): void {
  const dv = new DataView(src.buffer, src.byteOffset, src.byteLength);
  if (type === 'F32') {
    if (LITTLE_ENDIAN && src.byteOffset % 4 === 0) out.set(new Float32Array(src.buffer, src.byteOffset, count), at);
    else for (let i = 0; i < count; i++) out[at + i] = dv.getFloat32(4 * i, true);
  } else if (type === 'F16') {
    for (let i = 0; i < count; i++) out[at + i] = halfToFloat(dv.getUint16(2 * i, true));
  } else if (type === 'BF16') {
    for (let i = 0; i < count; i++) out[at + i] = bfloat16ToFloat(dv.getUint16(2 * i, true));
  } else if (type === 'Q8_0') {
    for (let b = 0; b < count / 32; b++) {
      const d = halfToFloat(dv.getUint16(34 * b, true));
      for (let j = 0; j < 32; j++) out[at + 32 * b + j] = dv.getInt8(34 * b + 2 + j) * d;
    }
  } else if (type === 'Q4_0') {
    for (let b = 0; b < count / 32; b++) {
      const d = halfToFloat(dv.getUint16(18 * b, true));
      for (let j = 0; j < 16; j++) {
        const byte = src[18 * b + 2 + j];
        out[at + 32 * b + j] = ((byte & 15) - 8) * d;
        out[at + 32 * b + j + 16] = ((byte >> 4) - 8) * d;
      }
    }
  } else if (type === 'Q4_K') {
    for (let b = 0; b < count / 256; b++) decodeQ4K(src, 144 * b, out, at + 256 * b);
  } else {
    for (let b = 0; b < count / 256; b++) decodeQ6K(src, 210 * b, out, at + 256 * b);
  }
}

/** ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j of a Q4_K block's 12 scale bytes at `q`. */
function scaleMinK4(j: number, src: Uint8Array, q: number): [number, number] {
  if (j < 4) return [src[q + j] & 63, src[q + j + 4] & 63];
  return [(src[q + j + 4] & 0xf) | ((src[q + j - 4] >> 6) << 4), (src[q + j + 4] >> 4) | ((src[q + j] >> 6) << 4)];
}

function decodeQ4K(src: Uint8Array, at: number, out: Float32Array, o: number): void {
  const d = halfToFloat(src[at] | (src[at + 1] << 8));
  const min = halfToFloat(src[at + 2] | (src[at + 3] << 8));
  const scales = at + 4;
  let q = at + 16;
  for (let j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    const [sc1, m1] = scaleMinK4(is, src, scales);
    const [sc2, m2] = scaleMinK4(is + 1, src, scales);
    const d1 = f32(d * sc1);
    const min1 = f32(min * m1);
    const d2 = f32(d * sc2);
    const min2 = f32(min * m2);
    for (let l = 0; l < 32; l++) out[o + j + l] = f32(d1 * (src[q + l] & 0xf)) - min1;
    for (let l = 0; l < 32; l++) out[o + j + 32 + l] = f32(d2 * (src[q + l] >> 4)) - min2;
  }
}

function decodeQ6K(src: Uint8Array, at: number, out: Float32Array, o: number): void {
  const d = halfToFloat(src[at + 208] | (src[at + 209] << 8));
  const sc = (i: number) => (src[at + 192 + i] << 24) >> 24; // int8
  for (let n = 0; n < 2; n++) {
    const ql = at + 64 * n;
    const qh = at + 128 + 32 * n;
    const s = 8 * n;
    const y = o + 128 * n;
    for (let l = 0; l < 32; l++) {
      const is = l >> 4;
      const h = src[qh + l];
      const q1 = ((src[ql + l] & 0xf) | ((h & 3) << 4)) - 32;
      const q2 = ((src[ql + l + 32] & 0xf) | (((h >> 2) & 3) << 4)) - 32;
      const q3 = ((src[ql + l] >> 4) | (((h >> 4) & 3) << 4)) - 32;
      const q4 = ((src[ql + l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32;
      out[y + l] = f32(d * sc(s + is)) * q1;
      out[y + l + 32] = f32(d * sc(s + is + 2)) * q2;
      out[y + l + 64] = f32(d * sc(s + is + 4)) * q3;
      out[y + l + 96] = f32(d * sc(s + is + 6)) * q4;
    }
  }
}

/**
 * Rows `[from, from + n)` of a Q8_0 or Q4_0 (as int8 / int4) or BF16 (as bf16) tensor, bytes in `src`, into `p`
 * (a PackedMatrix whose cols are the rows' length): exactly, blocks reordered, nothing rounded.
 */
export function blocksToPacked(type: 'Q8_0' | 'Q4_0' | 'BF16', src: Uint8Array, p: PackedMatrix, from: number, n: number): void {
  const dv = new DataView(src.buffer, src.byteOffset, src.byteLength);
  if (type === 'BF16') {
    const bits = p.data as Uint16Array;
    for (let i = 0; i < n * p.cols; i++) bits[from * p.cols + i] = dv.getUint16(2 * i, true);
    return;
  }
  const data = p.data as Uint8Array;
  const blocks = (n * p.cols) / 32;
  const first = (from * p.cols) / 32;
  for (let b = 0; b < blocks; b++) {
    const g = first + b;
    if (type === 'Q8_0') {
      p.scales[g] = scaleOf(dv.getUint16(34 * b, true));
      for (let j = 0; j < 32; j++) data[32 * g + j] = src[34 * b + 2 + j] ^ 0x80; // int8 q → q + 128
    } else {
      p.scales[g] = scaleOf(dv.getUint16(18 * b, true));
      const q = (k: number) => (k < 16 ? src[18 * b + 2 + k] & 15 : src[18 * b + 2 + k - 16] >> 4);
      for (let j = 0; j < 16; j++) data[16 * g + j] = q(2 * j) | (q(2 * j + 1) << 4);
    }
  }
}

/** Rows `[from, from + n)` of `p` as GGUF blocks of `type` (its own format: int8 → Q8_0, int4 → Q4_0, bf16 → BF16). */
export function packedToBlocks(p: PackedMatrix, from: number, n: number): Uint8Array {
  if (p.format === 'bf16') {
    const bits = (p.data as Uint16Array).subarray(from * p.cols, (from + n) * p.cols);
    const out = new Uint8Array(2 * bits.length);
    const dv = new DataView(out.buffer);
    for (let i = 0; i < bits.length; i++) dv.setUint16(2 * i, bits[i], true);
    return out;
  }
  const data = p.data as Uint8Array;
  const blocks = (n * p.cols) / 32;
  const first = (from * p.cols) / 32;
  const width = p.format === 'int8' ? 34 : 18;
  const out = new Uint8Array(blocks * width);
  const dv = new DataView(out.buffer);
  for (let b = 0; b < blocks; b++) {
    const g = first + b;
    dv.setUint16(width * b, floatToHalf(p.scales[g]), true);
    if (p.format === 'int8') {
      for (let j = 0; j < 32; j++) out[34 * b + 2 + j] = data[32 * g + j] ^ 0x80; // q + 128 → int8 q
    } else {
      const q = (k: number) => (data[16 * g + (k >> 1)] >> (4 * (k & 1))) & 15;
      for (let j = 0; j < 16; j++) out[18 * b + 2 + j] = q(j) | (q(j + 16) << 4);
    }
  }
  return out;
}

/** `count` float32 values as F32, F16 or BF16 bytes. */
export function encodeFloats(type: 'F32' | 'F16' | 'BF16', src: ArrayLike<number>, from: number, count: number): Uint8Array {
  const out = new Uint8Array(count * (type === 'F32' ? 4 : 2));
  const dv = new DataView(out.buffer);
  if (type === 'F32') for (let i = 0; i < count; i++) dv.setFloat32(4 * i, src[from + i], true);
  else if (type === 'F16') for (let i = 0; i < count; i++) dv.setUint16(2 * i, floatToHalf(src[from + i]), true);
  else for (let i = 0; i < count; i++) dv.setUint16(2 * i, floatToBfloat16(src[from + i]), true);
  return out;
}
