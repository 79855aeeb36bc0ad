import { InvalidArgumentError, InvalidMessageError, ShapeMismatchError } from '../errors.ts';
import { floatToHalf, halfToFloat } from '../tensor/index.ts';
import { type BlockLayout, blockShape, dctBlocks, MAX_CHUNK, MAX_RANK, SparseIdct } from './dct.ts';
import { MAX_BLOCK_SIZE, topkBlocks } from './topk.ts';

/**
 * Gradient compression as in DeMo / Templar: blockwise DCT, the top-k coefficients of each
 * block, quantised, with error feedback (what a step does not send is added to the next step's
 * gradient, quantisation error included).
 *
 * The wire format of one compressed gradient (all little-endian):
 *   [4 × u8 magic "DCTK"][u8 version = 1][u8 bits: 32 | 16 | 8][u16 chunk: 1..256][u32 k]
 *   [u8 rank: 0..8][rank × u32 dims, each ≥ 1]
 *   [blocks × k × u16 indices]    inside each block, strictly ascending, < block size
 *   [blocks × k × value]          f32 (bits 32), f16 (bits 16) or i8 in -127..127 (bits 8)
 *   [blocks × f32 scale]          bits 8 only: value = i8 × scale; finite, ≥ 0
 * The block layout (and so `blocks` and the block size) follows from the shape and chunk
 * (dct.ts); k is the number kept per block, 1..block size. Blocks come in the order of the
 * block grid, row-major. A message whose length, header or contents disagree with this is
 * an InvalidMessageError; nothing is allocated before the length is known to match.
 */

/** Bits per transmitted coefficient value. */
export type GradientBits = 32 | 16 | 8;

/** Options of the `dct-topk` gradient compression. */
export interface DctTopkOptions {
  /** Coefficients kept per block (clamped to the block size). */
  k: number;
  /** Largest block side; each dim's block is its largest divisor ≤ chunk. */
  chunk: number;
  /** Bits per kept value: 32 float, 16 half, 8 int8 with one scale per block. */
  bits: GradientBits;
}

/** Templar's settings: 32 of 64 × 64 = 4,096 coefficients per block, 8-bit values (~250× smaller than float32). */
export const DCT_TOPK_DEFAULTS: Readonly<DctTopkOptions> = Object.freeze({ k: 32, chunk: 64, bits: 8 });
/** The CLI form of the option, for help and error messages. */
export const DCT_TOPK_FORM = 'dct-topk[:k=N,chunk=N,bits=N]';

const BITS: readonly number[] = [32, 16, 8];
const MAGIC = [0x44, 0x43, 0x54, 0x4b]; // "DCTK"
const VERSION = 1;
const HEADER_BYTES = 13; // magic, version, bits, chunk, k, rank
const VALUE_WIDTH: Record<GradientBits, number> = { 32: 4, 16: 2, 8: 1 };
/** The largest finite half: bits-16 values saturate here instead of becoming infinite. */
const HALF_MAX = 65504;

/** Checks options (k 1..65,536, chunk 1..256, bits 32 | 16 | 8); throws InvalidArgumentError saying what is allowed. */
export function checkDctTopk(options: DctTopkOptions): DctTopkOptions {
  const { k, chunk, bits } = options;
  if (!Number.isInteger(k) || k < 1 || k > MAX_BLOCK_SIZE) throw new InvalidArgumentError(`dct-topk k must be an integer in 1..${MAX_BLOCK_SIZE}, got ${k}`);
  if (!Number.isInteger(chunk) || chunk < 1 || chunk > MAX_CHUNK) {
    throw new InvalidArgumentError(`dct-topk chunk must be an integer in 1..${MAX_CHUNK}, got ${chunk}`);
  }
  if (!BITS.includes(bits)) throw new InvalidArgumentError(`dct-topk bits must be 32, 16 or 8, got ${bits}`);
  return { k, chunk, bits };
}

/**
 * Parses the CLI form `dct-topk[:k=N,chunk=N,bits=N]`; keys left out take DCT_TOPK_DEFAULTS.
 * @example parseDctTopk('dct-topk:k=64,bits=16') // { k: 64, chunk: 64, bits: 16 }
 */
export function parseDctTopk(text: string): DctTopkOptions {
  const bad = (why: string) => new InvalidArgumentError(`${why}: expected ${DCT_TOPK_FORM} with integer values (k 1..${MAX_BLOCK_SIZE}, chunk 1..${MAX_CHUNK}, bits 32, 16 or 8)`);
  if (text === 'dct-topk') return { ...DCT_TOPK_DEFAULTS };
  if (typeof text !== 'string' || !text.startsWith('dct-topk:')) throw bad(`'${text}' is not a dct-topk option`);
  const options: Record<string, number> = { ...DCT_TOPK_DEFAULTS };
  const seen = new Set<string>();
  for (const pair of text.slice('dct-topk:'.length).split(',')) {
    const m = /^(k|chunk|bits)=([0-9]{1,9})$/.exec(pair);
    if (m === null) throw bad(`'${pair}' is not one of k=N, chunk=N, bits=N`);
    if (seen.has(m[1])) throw bad(`${m[1]} is given twice`);
    seen.add(m[1]);
    options[m[1]] = Number(m[2]);
  }
  return checkDctTopk(options as unknown as DctTopkOptions);
}

/** One compressed gradient: the kept coefficients of every block of a parameter. */
export interface CompressedGradient {
  shape: number[];
  chunk: number;
  bits: GradientBits;
  /** Kept per block (the option's k clamped to the block size). */
  k: number;
  /** blocks × k indices inside each block, strictly ascending per block. */
  indices: Uint16Array;
  /** blocks × k values: Float32Array (bits 32), half bits as Uint16Array (16), Int8Array (8). */
  values: Float32Array | Uint16Array | Int8Array;
  /** One scale per block for bits 8 (value = q × scale); empty otherwise. */
  scales: Float32Array;
}

/** Bytes of a float32 dense gradient of this shape (the baseline of a compression ratio). */
export function denseBytes(shape: readonly number[]): number {
  return 4 * shape.reduce((a, b) => a * b, 1);
}

/** Bytes of encodeCompressed(c) for a consistent c, without encoding. */
export function compressedBytes(c: CompressedGradient): number {
  const blocks = c.indices.length / c.k;
  return HEADER_BYTES + 4 * c.shape.length + c.indices.length * (2 + VALUE_WIDTH[c.bits]) + (c.bits === 8 ? 4 * blocks : 0);
}

type ErrorClass = typeof InvalidArgumentError | typeof InvalidMessageError;

/** Checks that c is consistent with its own layout; returns the layout. Errors are of class E. */
function checkCompressed(c: CompressedGradient, E: ErrorClass): BlockLayout {
  if (!BITS.includes(c.bits)) throw new E(`bits must be 32, 16 or 8, got ${c.bits}`);
  let layout: BlockLayout;
  try {
    layout = blockShape(c.shape, c.chunk);
  } catch (err) {
    throw new E(`bad shape or chunk: ${(err as Error).message}`);
  }
  const size = layout.br * layout.bc;
  if (!Number.isInteger(c.k) || c.k < 1 || c.k > size) throw new E(`k ${c.k} is outside 1..${size} (the block size)`);
  const n = layout.blocks * c.k;
  const valueType = c.bits === 32 ? Float32Array : c.bits === 16 ? Uint16Array : Int8Array;
  if (!(c.indices instanceof Uint16Array) || c.indices.length !== n) throw new E(`expected ${n} u16 indices`);
  if (!(c.values instanceof valueType) || c.values.length !== n) throw new E(`expected ${n} values of ${c.bits} bits`);
  if (!(c.scales instanceof Float32Array) || c.scales.length !== (c.bits === 8 ? layout.blocks : 0)) throw new E('wrong number of scales');
  for (let b = 0; b < layout.blocks; b++) {
    let prev = -1;
    for (let j = b * c.k; j < (b + 1) * c.k; j++) {
      const idx = c.indices[j];
      if (idx <= prev || idx >= size) throw new E(`block ${b}: indices must be ascending and below ${size}`);
      prev = idx;
    }
  }
  for (let j = 0; j < n; j++) {
    const v = c.values[j];
    const ok = c.bits === 32 ? Number.isFinite(v) : c.bits === 16 ? (v & 0x7c00) !== 0x7c00 : v !== -128;
    if (!ok) throw new E(`value ${j} is not finite or out of range`);
  }
  for (const s of c.scales) if (!(Number.isFinite(s) && s >= 0)) throw new E('a scale is not finite and ≥ 0');
  return layout;
}

/** The float32 values a receiver computes with: dequantised c.values. */
function dequantise(c: CompressedGradient): Float32Array {
  const out = new Float32Array(c.values.length);
  if (c.bits === 32) out.set(c.values);
  else if (c.bits === 16) for (let j = 0; j < out.length; j++) out[j] = halfToFloat(c.values[j]);
  else for (let j = 0; j < out.length; j++) out[j] = c.values[j] * c.scales[Math.floor(j / c.k)];
  return out;
}

function reconstruct(layout: BlockLayout, c: CompressedGradient): Float32Array {
  const values = dequantise(c);
  const out = new Float32Array(layout.rows * layout.cols);
  const idct = new SparseIdct(layout.rows, layout.cols, layout.br, layout.bc);
  for (let b = 0; b < layout.blocks; b++) idct.block(out, b, c.indices, values, b * c.k, c.k);
  return out;
}

/**
 * The dense gradient (row-major, c.shape) that a compressed gradient stands for. Deterministic:
 * the same c gives bit-identical output everywhere. Throws InvalidArgumentError if c is inconsistent.
 */
export function decompressGradient(c: CompressedGradient): Float32Array {
  return reconstruct(checkCompressed(c, InvalidArgumentError), c);
}

/**
 * Compresses gradients with error feedback, one residual per parameter name.
 * @example
 * const gc = new GradientCompressor({ k: 32, chunk: 64, bits: 8 });
 * const bytes = encodeCompressed(gc.compress('h.0.attn.c_attn.weight', grad, [768, 2304]));
 */
export class GradientCompressor {
  readonly options: DctTopkOptions;
  private readonly residuals = new Map<string, { shape: string; data: Float32Array }>();

  constructor(options: Partial<DctTopkOptions> = {}) {
    this.options = checkDctTopk({ ...DCT_TOPK_DEFAULTS, ...options });
  }

  /**
   * acc = grad + residual; keeps the top-k DCT coefficients of each block of acc, quantised;
   * the residual becomes acc − decompressGradient(result). `grad` is row-major of `shape`
   * and finite (else InvalidArgumentError / ShapeMismatchError; the residual is then unchanged).
   */
  compress(name: string, grad: Float32Array, shape: readonly number[]): CompressedGradient {
    const { k, chunk, bits } = this.options;
    const layout = blockShape(shape, chunk);
    if (grad.length !== layout.rows * layout.cols) throw new ShapeMismatchError(`${name}: ${grad.length} values for shape [${shape}]`);
    const key = shape.join(',');
    const prev = this.residuals.get(name);
    if (prev !== undefined && prev.shape !== key) throw new ShapeMismatchError(`${name}: shape [${shape}] differs from its earlier [${prev.shape}]`);
    for (let i = 0; i < grad.length; i++) {
      if (!Number.isFinite(grad[i])) throw new InvalidArgumentError(`${name}: gradient value ${i} is not finite (${grad[i]})`);
    }
    const acc = grad.slice();
    if (prev !== undefined) for (let i = 0; i < acc.length; i++) acc[i] += prev.data[i];
    const coeffs = dctBlocks(acc, layout.rows, layout.cols, layout.br, layout.bc);
    const top = topkBlocks(coeffs, layout.br * layout.bc, k);
    const c: CompressedGradient = { shape: [...shape], chunk, bits, k: top.k, indices: top.indices, ...quantise(top.values, top.k, bits) };
    const sent = reconstruct(layout, c);
    for (let i = 0; i < acc.length; i++) acc[i] -= sent[i];
    this.residuals.set(name, { shape: key, data: acc });
    return c;
  }

  /** A copy of the residual held for `name` (undefined before its first step). */
  residual(name: string): Float32Array | undefined {
    const r = this.residuals.get(name);
    return r === undefined ? undefined : r.data.slice();
  }

  /** Puts back a residual taken with `residual(name)` (undefined: none yet), e.g. when a step is retried. */
  restore(name: string, shape: readonly number[], data: Float32Array | undefined): void {
    if (data === undefined) this.residuals.delete(name);
    else this.residuals.set(name, { shape: shape.join(','), data: data.slice() });
  }

  /** Forgets every residual (e.g. after the model was reloaded). */
  reset(): void {
    this.residuals.clear();
  }
}

function quantise(values: Float32Array, k: number, bits: GradientBits): Pick<CompressedGradient, 'values' | 'scales'> {
  if (bits === 32) return { values, scales: new Float32Array(0) };
  if (bits === 16) {
    const half = new Uint16Array(values.length);
    for (let j = 0; j < values.length; j++) half[j] = floatToHalf(Math.max(-HALF_MAX, Math.min(HALF_MAX, values[j])));
    return { values: half, scales: new Float32Array(0) };
  }
  const blocks = values.length / k;
  const q = new Int8Array(values.length);
  const scales = new Float32Array(blocks);
  for (let b = 0; b < blocks; b++) {
    let max = 0;
    for (let j = b * k; j < (b + 1) * k; j++) max = Math.max(max, Math.abs(values[j]));
    const scale = Math.fround(max / 127);
    scales[b] = scale;
    if (scale === 0) continue;
    for (let j = b * k; j < (b + 1) * k; j++) {
      const x = values[j] / scale;
      q[j] = Math.max(-127, Math.min(127, Math.sign(x) * Math.round(Math.abs(x))));
    }
  }
  return { values: q, scales };
}

/** Encodes a compressed gradient in the wire format above. Throws InvalidArgumentError if c is inconsistent. */
export function encodeCompressed(c: CompressedGradient): Uint8Array {
  checkCompressed(c, InvalidArgumentError);
  const out = new Uint8Array(compressedBytes(c));
  const view = new DataView(out.buffer);
  out.set(MAGIC, 0);
  out[4] = VERSION;
  out[5] = c.bits;
  view.setUint16(6, c.chunk, true);
  view.setUint32(8, c.k, true);
  out[12] = c.shape.length;
  let o = HEADER_BYTES;
  for (const d of c.shape) o = put(view, o, 4, d);
  for (const idx of c.indices) o = put(view, o, 2, idx);
  if (c.bits === 32) for (const v of c.values) o = put(view, o, -4, v);
  else if (c.bits === 16) for (const v of c.values) o = put(view, o, 2, v);
  else for (const v of c.values) o = put(view, o, -1, v);
  for (const s of c.scales) o = put(view, o, -4, s);
  return out;
}

/** Writes one little-endian number: width 4 / 2 unsigned, −4 float32, −1 int8. Returns the next offset. */
function put(view: DataView, o: number, width: 4 | 2 | -4 | -1, v: number): number {
  if (width === 4) view.setUint32(o, v, true);
  else if (width === 2) view.setUint16(o, v, true);
  else if (width === -4) view.setFloat32(o, v, true);
  else view.setInt8(o, v);
  return o + Math.abs(width);
}

/**
 * Decodes the wire format above. Anything truncated, oversized, inconsistent or out of range
 * is an InvalidMessageError, and so is a shape other than `expectShape` when one is given (a
 * receiver that knows the parameter's shape passes it, so a few bytes cannot make it allocate
 * a gradient of a size it never asked for). The result is safe to pass to decompressGradient.
 */
export function decodeCompressed(bytes: Uint8Array, expectShape?: readonly number[]): CompressedGradient {
  if (!(bytes instanceof Uint8Array) || bytes.length < HEADER_BYTES) throw new InvalidMessageError('compressed gradient too short for its header');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (MAGIC.some((m, i) => bytes[i] !== m)) throw new InvalidMessageError('not a compressed gradient (bad magic)');
  if (bytes[4] !== VERSION) throw new InvalidMessageError(`compressed gradient version ${bytes[4]} is not ${VERSION}`);
  const bits = bytes[5] as GradientBits;
  if (!BITS.includes(bits)) throw new InvalidMessageError(`bits ${bits} is not 32, 16 or 8`);
  const chunk = view.getUint16(6, true);
  const k = view.getUint32(8, true);
  const rank = bytes[12];
  if (rank > MAX_RANK) throw new InvalidMessageError(`rank ${rank} exceeds ${MAX_RANK}`);
  if (bytes.length < HEADER_BYTES + 4 * rank) throw new InvalidMessageError('compressed gradient too short for its shape');
  const shape: number[] = [];
  for (let i = 0; i < rank; i++) shape.push(view.getUint32(HEADER_BYTES + 4 * i, true));
  if (expectShape !== undefined && (expectShape.length !== rank || expectShape.some((d, i) => d !== shape[i]))) {
    throw new InvalidMessageError(`compressed gradient of shape [${shape}], expected [${expectShape}]`);
  }
  let layout: BlockLayout;
  try {
    layout = blockShape(shape, chunk);
  } catch (err) {
    throw new InvalidMessageError(`bad shape [${shape}] or chunk ${chunk}: ${(err as Error).message}`);
  }
  if (k < 1 || k > layout.br * layout.bc) throw new InvalidMessageError(`k ${k} is outside 1..${layout.br * layout.bc} (the block size)`);
  const n = layout.blocks * k;
  const width = VALUE_WIDTH[bits];
  const expected = HEADER_BYTES + 4 * rank + n * (2 + width) + (bits === 8 ? 4 * layout.blocks : 0);
  if (bytes.length !== expected) throw new InvalidMessageError(`compressed gradient of ${bytes.length} bytes, its header says ${expected}`);
  let o = HEADER_BYTES + 4 * rank;
  const indices = new Uint16Array(n);
  for (let j = 0; j < n; j++, o += 2) indices[j] = view.getUint16(o, true);
  let values: CompressedGradient['values'];
  if (bits === 32) {
    values = new Float32Array(n);
    for (let j = 0; j < n; j++, o += 4) values[j] = view.getFloat32(o, true);
  } else if (bits === 16) {
    values = new Uint16Array(n);
    for (let j = 0; j < n; j++, o += 2) values[j] = view.getUint16(o, true);
  } else {
    values = new Int8Array(n);
    for (let j = 0; j < n; j++, o += 1) values[j] = view.getInt8(o);
  }
  const scales = new Float32Array(bits === 8 ? layout.blocks : 0);
  for (let b = 0; b < scales.length; b++, o += 4) scales[b] = view.getFloat32(o, true);
  const c: CompressedGradient = { shape, chunk, bits, k, indices, values, scales };
  checkCompressed(c, InvalidMessageError);
  return c;
}
