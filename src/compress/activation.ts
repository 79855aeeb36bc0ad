import { InvalidArgumentError, InvalidMessageError } from '../errors.ts';
import { floatToHalf, halfToFloat } from '../tensor/index.ts';
import { MAX_ELEMENTS, MAX_RANK } from './dct.ts';

/**
 * Codecs for activations (and their gradients) sent between pipeline stages:
 *   none  float32, 4 bytes per element:        parts [f32 × n]
 *   fp16  IEEE half, 2 bytes per element:      parts [f16 × n]   (round to nearest even;
 *         overflow → ±Inf, NaN stays NaN, subnormals kept, −0 kept)
 *   int8  per row (the last dim), symmetric:   parts [i8 × n, f32 × rows]
 *         scale = max|x| / 127 (0 for a zero row), q = round-half-away(x / scale) in −127..127,
 *         decoded as q × scale; every value must be finite.
 * All little-endian. A sender that needs to know exactly what the receiver computes on uses
 * roundTrip. Decoders check every length against the shape and reject any mismatch with
 * InvalidMessageError.
 */

/** The names accepted by --activations (or wherever a codec is chosen). */
export const ACTIVATION_CODECS = ['none', 'fp16', 'int8'] as const;
export type ActivationCodec = (typeof ACTIVATION_CODECS)[number];

/** An encoded activation: plain data, ready to go out as tensor frames or parts of one. */
export interface EncodedActivation {
  codec: ActivationCodec;
  shape: number[];
  /** none: [f32 bytes]; fp16: [f16 bytes]; int8: [i8 bytes, f32 scale bytes (one per row)]. */
  parts: Uint8Array[];
}

/** The largest magnitude an int8 code stands for (−128 is never used, so the range is symmetric). */
const Q_MAX = 127;
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * Parses a codec name; anything else is an InvalidArgumentError that lists the names.
 * @example parseActivationCodec('fp16') // 'fp16'
 */
export function parseActivationCodec(text: string): ActivationCodec {
  if ((ACTIVATION_CODECS as readonly string[]).includes(text)) return text as ActivationCodec;
  throw new InvalidArgumentError(`unknown activation codec '${text}': use one of ${ACTIVATION_CODECS.join(', ')}`);
}

/** Elements and rows (the product of all dims but the last) of a shape; throws E if the shape is not one. */
function measure(shape: readonly number[], E: typeof InvalidArgumentError): { size: number; rows: number } {
  if (!Array.isArray(shape) || shape.length > MAX_RANK) throw new E(`an activation shape has rank 0..${MAX_RANK}`);
  let size = 1;
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 0) throw new E(`activation shape [${shape}] has a dim that is not an integer ≥ 0`);
    size *= d;
    if (size > MAX_ELEMENTS) throw new E(`activation shape [${shape}] has more than ${MAX_ELEMENTS} elements`);
  }
  const rows = shape.slice(0, -1).reduce((a, b) => a * b, 1);
  if (rows > MAX_ELEMENTS) throw new E(`activation shape [${shape}] has more than ${MAX_ELEMENTS} rows`);
  return { size, rows };
}

/**
 * Bytes on the wire for an activation of this shape: none 4 per element, fp16 2,
 * int8 1 per element plus 4 per row.
 */
export function activationBytes(shape: readonly number[], codec: ActivationCodec): number {
  const { size, rows } = measure(shape, InvalidArgumentError);
  if (codec === 'none') return 4 * size;
  if (codec === 'fp16') return 2 * size;
  if (codec === 'int8') return size + 4 * rows;
  throw new InvalidArgumentError(`unknown activation codec '${codec}': use one of ${ACTIVATION_CODECS.join(', ')}`);
}

/**
 * Encodes `data` (row-major, of `shape`) with a codec.
 * @example encodeActivation(new Float32Array([127, -254]), [1, 2], 'int8') // parts: i8 [64, -127], f32 [2]
 */
export function encodeActivation(data: Float32Array, shape: readonly number[], codec: ActivationCodec): EncodedActivation {
  const { size, rows } = measure(shape, InvalidArgumentError);
  if (data.length !== size) throw new InvalidArgumentError(`${data.length} values for activation shape [${shape}]`);
  const out = { codec, shape: [...shape] };
  if (codec === 'none') return { ...out, parts: [leBytes(Float32Array.from(data))] };
  if (codec === 'fp16') {
    const half = new Uint16Array(size);
    for (let i = 0; i < size; i++) half[i] = floatToHalf(data[i]);
    return { ...out, parts: [leBytes(half)] };
  }
  if (codec === 'int8') {
    const { q, scales } = quantiseRows(data, rows);
    return { ...out, parts: [new Uint8Array(q.buffer), leBytes(scales)] };
  }
  throw new InvalidArgumentError(`unknown activation codec '${codec}': use one of ${ACTIVATION_CODECS.join(', ')}`);
}

function quantiseRows(data: Float32Array, rows: number): { q: Int8Array; scales: Float32Array } {
  const cols = rows === 0 ? 0 : data.length / rows;
  const q = new Int8Array(data.length);
  const scales = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let max = 0;
    for (let i = r * cols; i < (r + 1) * cols; i++) {
      const a = Math.abs(data[i]);
      if (!(a <= Number.MAX_VALUE)) throw new InvalidArgumentError(`int8 needs finite activations; value ${i} is ${data[i]}`);
      if (a > max) max = a;
    }
    const scale = Math.fround(max / Q_MAX);
    scales[r] = scale;
    if (scale === 0) continue;
    for (let i = r * cols; i < (r + 1) * cols; i++) {
      const x = data[i] / scale;
      q[i] = Math.max(-Q_MAX, Math.min(Q_MAX, Math.sign(x) * Math.round(Math.abs(x))));
    }
  }
  return { q, scales };
}

/**
 * Decodes an activation received from a peer: the values the sender's roundTrip computed.
 * Lengths that disagree with the shape, an unknown codec, a bad shape, a scale that is not
 * finite and ≥ 0, or an int8 code of −128 are InvalidMessageError.
 */
export function decodeActivation(encoded: EncodedActivation): Float32Array {
  const { codec, shape, parts } = encoded;
  if (!(ACTIVATION_CODECS as readonly string[]).includes(codec)) throw new InvalidMessageError(`unknown activation codec '${codec}'`);
  const { size, rows } = measure(shape, InvalidMessageError);
  const want = codec === 'int8' ? [size, 4 * rows] : [(codec === 'none' ? 4 : 2) * size];
  if (!Array.isArray(parts) || parts.length !== want.length || parts.some((p, i) => !(p instanceof Uint8Array) || p.length !== want[i])) {
    throw new InvalidMessageError(`${codec} activation [${shape}] needs parts of [${want}] bytes`);
  }
  if (codec === 'none') return fromLe(parts[0], Float32Array);
  if (codec === 'fp16') {
    const half = fromLe(parts[0], Uint16Array);
    const table = halfTable();
    const out = new Float32Array(size);
    for (let i = 0; i < size; i++) out[i] = table[half[i]];
    return out;
  }
  const q = new Int8Array(parts[0].buffer, parts[0].byteOffset, size);
  const scales = fromLe(parts[1], Float32Array);
  for (const s of scales) if (!(Number.isFinite(s) && s >= 0)) throw new InvalidMessageError('an int8 row scale is not finite and ≥ 0');
  const out = new Float32Array(size);
  const cols = rows === 0 ? 0 : size / rows;
  for (let r = 0; r < rows; r++) {
    for (let i = r * cols; i < (r + 1) * cols; i++) {
      if (q[i] === -128) throw new InvalidMessageError(`int8 code ${i} is -128 (codes are -127..127)`);
      out[i] = q[i] * scales[r];
    }
  }
  return out;
}

/**
 * decode(encode(data)): the values a receiver will compute on, for the sender to compute on
 * too (so both ends of a pipeline agree bit for bit). Always a new array.
 */
export function roundTrip(data: Float32Array, shape: readonly number[], codec: ActivationCodec): Float32Array {
  return decodeActivation(encodeActivation(data, shape, codec));
}

let table: Float32Array | undefined;

/** Every half's float32 value (256 KiB, built once): decoding is one lookup per element. */
function halfTable(): Float32Array {
  if (table === undefined) {
    table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) table[h] = halfToFloat(h);
  }
  return table;
}

/** Little-endian bytes of a typed array (a copy's bytes on a big-endian host). */
function leBytes(a: Float32Array | Uint16Array): Uint8Array {
  const bytes = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  return LITTLE_ENDIAN ? bytes : swap(bytes.slice(), a.BYTES_PER_ELEMENT);
}

/** A fresh typed array from little-endian bytes of exactly n × width (any alignment). */
function fromLe<T extends Float32Array | Uint16Array>(bytes: Uint8Array, type: { new (b: ArrayBuffer): T; BYTES_PER_ELEMENT: number }): T {
  const copy = bytes.slice();
  if (!LITTLE_ENDIAN) swap(copy, type.BYTES_PER_ELEMENT);
  return new type(copy.buffer);
}

function swap(bytes: Uint8Array, width: number): Uint8Array {
  for (let i = 0; i < bytes.length; i += width) bytes.subarray(i, i + width).reverse();
  return bytes;
}
