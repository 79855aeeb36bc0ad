import { InvalidArgumentError } from '../../errors.ts';
import { bfloat16ToFloat, floatToBfloat16, floatToHalf, halfToFloat } from '../dtype.ts';

/**
 * Compact weights: a matrix W [rows = out features, cols = in features] held in fewer bytes than float32 and
 * computed in float32.
 * - `bf16`: every weight's upper 16 bits (a bf16 checkpoint's own bytes).
 * - `int8`, `int4`: blocks of 32 weights along a row, each with one scale, in the layout of onnxruntime's
 *   `com.microsoft` `MatMulNBits`: data [rows, blocks, 32 · bits / 8] of unsigned values with the zero point
 *   2^(bits − 1) (128, or 8), two 4-bit values to a byte with the lower index in the low nibble; scales [rows · blocks].
 *   A row whose length is not a multiple of 32 ends in a block padded with zeros.
 *
 * The values are llama.cpp's: int8 is Q8_0 (scale = max |w| / 127, q = round(w / scale)) and int4 is Q4_0 (scale =
 * the block's weight of largest magnitude / −8, q = min(15, trunc(w / scale + 8.5))), computed in float32 as its
 * reference quantizer computes them, with each scale rounded to float16 as GGUF stores it. So a GGUF file's Q8_0 and
 * Q4_0 blocks are these blocks (reordered), in both directions, and our int4 of a float32 weight is llama.cpp's Q4_0
 * of it. A dequantized weight (q − zero point) · scale is exact in float32 (at most 8 + 11 significant bits).
 */
export const WEIGHT_FORMATS = ['bf16', 'int8', 'int4'] as const;
export type WeightFormat = (typeof WEIGHT_FORMATS)[number];
/** The quantized formats (blockwise, with scales). */
export type QuantFormat = Exclude<WeightFormat, 'bf16'>;

/** Weights per block of the quantized formats. */
export const QUANT_BLOCK = 32;

/** A matrix held in a compact format (see the module's comment for the layouts). */
export interface PackedMatrix {
  readonly format: WeightFormat;
  /** Out features (N). */
  readonly rows: number;
  /** In features (K). */
  readonly cols: number;
  /** bf16: the weights' bits [rows · cols]; int8/int4: [rows, blocksPerRow(cols), blobBytes(format)]. */
  readonly data: Uint16Array | Uint8Array;
  /** int8/int4: one scale per block [rows · blocksPerRow(cols)], each a float16 value; bf16: empty. */
  readonly scales: Float32Array;
}

export function bitsOf(format: QuantFormat): 8 | 4 {
  return format === 'int8' ? 8 : 4;
}

/** Bytes of one block's values. */
export function blobBytes(format: QuantFormat): number {
  return (QUANT_BLOCK * bitsOf(format)) / 8;
}

export function blocksPerRow(cols: number): number {
  return Math.ceil(cols / QUANT_BLOCK);
}

/** The value a stored q stands for 0 at. */
export function zeroPoint(format: QuantFormat): number {
  return format === 'int8' ? 128 : 8;
}

/** The bytes a packed matrix holds (values and scales). */
export function packedBytes(p: PackedMatrix): number {
  return p.data.byteLength + p.scales.byteLength;
}

/** The bytes a matrix of this shape takes in `format` (float32: 4 per weight). */
export function formatBytes(format: WeightFormat | 'f32', rows: number, cols: number): number {
  if (format === 'f32') return 4 * rows * cols;
  if (format === 'bf16') return 2 * rows * cols;
  const blocks = rows * blocksPerRow(cols);
  return blocks * (blobBytes(format) + 4);
}

export function parseWeightFormat(value: string, where: string): WeightFormat {
  if ((WEIGHT_FORMATS as readonly string[]).includes(value)) return value as WeightFormat;
  throw new InvalidArgumentError(`${where}: unknown weight format '${value}' (one of ${WEIGHT_FORMATS.join(', ')})`);
}

const f32 = Math.fround;
/** float32 → float16 → float32, as GGML_FP32_TO_FP16 stores a scale. */
const toHalf = (x: number) => halfToFloat(floatToHalf(x)) || 0; // a zero scale is +0
/** C's roundf: halves away from zero. */
const roundAway = (x: number) => (x < 0 ? -Math.round(-x) : Math.round(x));

/** Quantizes one block of `n` ≤ 32 weights at src[from…], zero-padded to 32; writes its values at data[at…]; returns its scale. */
function quantizeBlock(format: QuantFormat, src: ArrayLike<number>, from: number, n: number, data: Uint8Array, at: number): number {
  if (format === 'int8') {
    let amax = 0;
    for (let j = 0; j < n; j++) amax = Math.max(amax, Math.abs(src[from + j]));
    const d = f32(amax / 127);
    const id = d ? f32(1 / d) : 0;
    for (let j = 0; j < QUANT_BLOCK; j++) data[at + j] = (j < n ? roundAway(f32(src[from + j] * id)) : 0) + 128;
    return toHalf(d);
  }
  let amax = 0;
  let max = 0;
  for (let j = 0; j < n; j++) {
    const v = src[from + j];
    if (amax < Math.abs(v)) {
      amax = Math.abs(v);
      max = v;
    }
  }
  const d = f32(max / -8);
  const id = d ? f32(1 / d) : 0;
  const q = (j: number) => (j < n ? Math.min(15, Math.trunc(f32(f32(src[from + j] * id) + 8.5))) : 8);
  for (let j = 0; j < QUANT_BLOCK / 2; j++) data[at + j] = q(2 * j) | (q(2 * j + 1) << 4);
  return toHalf(d);
}

/**
 * `src` [rows, cols] (float32 values) in `format`.
 * @example
 * const w4 = packMatrix(weight.data, 4096, 4096, 'int4')   // 0.14 of the float32 bytes
 */
export function packMatrix(src: ArrayLike<number>, rows: number, cols: number, format: WeightFormat): PackedMatrix {
  if (src.length !== rows * cols) throw new InvalidArgumentError(`packMatrix: ${src.length} values do not fit [${rows}, ${cols}]`);
  const p = emptyPacked(rows, cols, format);
  packRows(p, 0, src);
  return p;
}

/** A packed matrix of zeros, to be filled by packRows. */
export function emptyPacked(rows: number, cols: number, format: WeightFormat): PackedMatrix {
  if (format === 'bf16') return { format, rows, cols, data: new Uint16Array(rows * cols), scales: new Float32Array(0) };
  const blocks = blocksPerRow(cols);
  const data = new Uint8Array(rows * blocks * blobBytes(format)).fill(format === 'int8' ? 128 : 0x88);
  return { format, rows, cols, data, scales: new Float32Array(rows * blocks) };
}

/** Packs `src` (whole rows of float32 values) into rows from `firstRow` of `p`: a matrix can be packed a few rows at a time. */
export function packRows(p: PackedMatrix, firstRow: number, src: ArrayLike<number>): void {
  const { cols, format } = p;
  const rows = src.length / cols;
  if (!Number.isInteger(rows) || firstRow + rows > p.rows) {
    throw new InvalidArgumentError(`packRows: ${src.length} values from row ${firstRow} do not fit [${p.rows}, ${cols}]`);
  }
  if (format === 'bf16') {
    const data = p.data as Uint16Array;
    const at = firstRow * cols;
    for (let i = 0; i < src.length; i++) data[at + i] = floatToBfloat16(src[i]);
    return;
  }
  const blocks = blocksPerRow(cols);
  const blob = blobBytes(format);
  const data = p.data as Uint8Array;
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < blocks; b++) {
      const from = r * cols + b * QUANT_BLOCK;
      const n = Math.min(QUANT_BLOCK, cols - b * QUANT_BLOCK);
      const block = (firstRow + r) * blocks + b;
      p.scales[block] = quantizeBlock(format, src, from, n, data, block * blob);
    }
  }
}

/** A packed matrix of bf16 bits as they are (a bf16 checkpoint's tensor): no rounding. */
export function bf16Matrix(bits: Uint16Array, rows: number, cols: number): PackedMatrix {
  if (bits.length !== rows * cols) throw new InvalidArgumentError(`bf16Matrix: ${bits.length} values do not fit [${rows}, ${cols}]`);
  return { format: 'bf16', rows, cols, data: bits, scales: new Float32Array(0) };
}

/**
 * Row `r` of a packed matrix as float32 values, into `out` (length ≥ cols; for int formats, ≥ blocks · 32, the padding
 * included as zeros).
 */
export function unpackRow(p: PackedMatrix, r: number, out: Float32Array): void {
  const { cols } = p;
  if (p.format === 'bf16') {
    const bits = p.data as Uint16Array;
    for (let j = 0; j < cols; j++) out[j] = bfloat16ToFloat(bits[r * cols + j]);
    return;
  }
  const blocks = blocksPerRow(cols);
  const blob = blobBytes(p.format);
  const data = p.data as Uint8Array;
  for (let b = 0; b < blocks; b++) {
    const s = p.scales[r * blocks + b];
    const at = (r * blocks + b) * blob;
    const o = b * QUANT_BLOCK;
    if (p.format === 'int8') {
      for (let j = 0; j < QUANT_BLOCK; j++) out[o + j] = (data[at + j] - 128) * s;
    } else {
      for (let j = 0; j < QUANT_BLOCK / 2; j++) {
        const byte = data[at + j];
        out[o + 2 * j] = ((byte & 15) - 8) * s;
        out[o + 2 * j + 1] = ((byte >> 4) - 8) * s;
      }
    }
  }
}

/** The whole matrix as float32 [rows, cols]. */
export function unpackMatrix(p: PackedMatrix): Float32Array {
  const out = new Float32Array(p.rows * p.cols);
  const row = new Float32Array(p.format === 'bf16' ? p.cols : blocksPerRow(p.cols) * QUANT_BLOCK);
  for (let r = 0; r < p.rows; r++) {
    unpackRow(p, r, row);
    out.set(row.subarray(0, p.cols), r * p.cols);
  }
  return out;
}

/**
 * A packed matrix as one run of bytes, as it travels between peers and is content-addressed: its values, then (int8,
 * int4) its scales, little-endian. Its length is formatBytes(format, rows, cols).
 */
export function packedToBytes(p: PackedMatrix): Uint8Array {
  const data = new Uint8Array(p.data.buffer, p.data.byteOffset, p.data.byteLength);
  if (p.scales.length === 0) return data;
  const out = new Uint8Array(data.byteLength + p.scales.byteLength);
  out.set(data);
  out.set(new Uint8Array(p.scales.buffer, p.scales.byteOffset, p.scales.byteLength), data.byteLength);
  return out;
}

/**
 * The packed matrix `bytes` hold (packedToBytes' layout), checked against its shape: views over `bytes` where they are
 * aligned (a buffer filled chunk by chunk becomes the matrix without a copy), a copy otherwise.
 */
export function packedFromBytes(format: WeightFormat, rows: number, cols: number, bytes: Uint8Array): PackedMatrix {
  const expected = formatBytes(format, rows, cols);
  if (bytes.byteLength !== expected) {
    throw new InvalidArgumentError(`a [${rows}, ${cols}] matrix in ${format} is ${expected} bytes, not ${bytes.byteLength}`);
  }
  const own = bytes.byteOffset % 4 === 0 ? bytes : bytes.slice();
  if (format === 'bf16') return { format, rows, cols, data: new Uint16Array(own.buffer, own.byteOffset, rows * cols), scales: new Float32Array(0) };
  const blocks = rows * blocksPerRow(cols);
  const dataBytes = blocks * blobBytes(format);
  return {
    format, rows, cols,
    data: new Uint8Array(own.buffer, own.byteOffset, dataBytes),
    scales: new Float32Array(own.buffer, own.byteOffset + dataBytes, blocks),
  };
}
