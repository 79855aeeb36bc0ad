import { InvalidMessageError } from '../errors.ts';
import { type Tensor, tensor } from '../tensor/index.ts';
import { type ActivationCodec, decodeActivation, encodeActivation, roundTrip } from './activation.ts';
import { blockShape } from './dct.ts';
import {
  checkDctTopk, DCT_TOPK_DEFAULTS, decodeCompressed, decompressGradient, type DctTopkOptions, encodeCompressed, GradientCompressor,
} from './gradient.ts';

/**
 * One tensor of a pipeline hop as it travels (the network's tensor frame without its request id):
 * - float32: as is;
 * - float16: the same shape, 2 bytes an element;
 * - int8: shape [..., 4 + cols]: each row its float32 scale (4 bytes, little-endian), then its
 *   cols int8 codes (value = code × scale).
 * A hop is one frame whatever its codec, and its dtype says how it was encoded.
 */
export interface HopPart {
  dtype: 'float32' | 'int32' | 'float16' | 'int8';
  shape: number[];
  bytes: Uint8Array;
}

/**
 * A tensor leaving on a hop: its frame (encoded by `codec`; float32 as is without one, token ids
 * always as is), and what the receiver will compute on (the hash the sender's record names).
 */
export function hopOut(t: Tensor, codec: Exclude<ActivationCodec, 'none'> | null): { part: HopPart; received: Tensor } {
  if (codec === null || t.dtype !== 'float32') {
    if (t.dtype === 'float64') throw new InvalidMessageError('a hop carries float32 activations or int32 token ids, not float64');
    const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    return { part: { dtype: t.dtype, shape: [...t.shape], bytes }, received: t };
  }
  const part = encodeHop(t, codec);
  return { part, received: decodeHop(part) };
}

/** A hop's frame as it arrived, as a tensor: its dtype says how it was encoded (float32 and int32 ids come as they are). */
export function hopIn(part: { dtype: string; shape: number[]; bytes: Uint8Array }): Tensor {
  if (part.dtype !== 'int32') return decodeHop(part as HopPart);
  const size = part.shape.reduce((a, b) => a * b, 1);
  if (part.shape.length > 8 || !part.shape.every((d) => Number.isInteger(d) && d >= 0) || part.bytes.length !== 4 * size) {
    throw new InvalidMessageError(`an int32 hop of shape [${part.shape}] needs ${4 * size} bytes, got ${part.bytes.length}`);
  }
  return tensor(new Int32Array(new Uint8Array(part.bytes).buffer), part.shape, 'int32');
}

/** A float32 tensor's bytes for a hop, encoded by `codec`. */
export function encodeHop(t: Tensor, codec: Exclude<ActivationCodec, 'none'>): HopPart {
  const data = t.data as Float32Array;
  const encoded = encodeActivation(data, t.shape, codec);
  if (codec === 'fp16') return { dtype: 'float16', shape: [...t.shape], bytes: encoded.parts[0] };
  const cols = t.shape.at(-1) ?? 1;
  const rows = cols === 0 ? 0 : data.length / cols;
  const bytes = new Uint8Array(rows * (4 + cols));
  const [q, scales] = encoded.parts;
  for (let r = 0; r < rows; r++) {
    bytes.set(scales.subarray(4 * r, 4 * r + 4), r * (4 + cols));
    bytes.set(q.subarray(r * cols, (r + 1) * cols), r * (4 + cols) + 4);
  }
  return { dtype: 'int8', shape: [...t.shape.slice(0, -1), 4 + cols], bytes };
}

/** A hop's float16 or int8 frame restored to the float32 tensor the sender's `receivedAs` computed. */
export function decodeHop(part: HopPart): Tensor {
  if (part.dtype === 'float32') return tensor(decodeActivation({ codec: 'none', shape: part.shape, parts: [part.bytes] }), part.shape);
  if (part.dtype === 'float16') return tensor(decodeActivation({ codec: 'fp16', shape: part.shape, parts: [part.bytes] }), part.shape);
  if (part.dtype !== 'int8') throw new InvalidMessageError(`a hop's tensor is float32, int32, float16 or int8, not ${String(part.dtype)}`);
  const width = part.shape.at(-1) ?? 0;
  if (part.shape.length === 0 || width < 4) throw new InvalidMessageError(`an int8 hop's rows hold a 4-byte scale and their codes: shape [${part.shape}]`);
  const cols = width - 4;
  const shape = [...part.shape.slice(0, -1), cols];
  const rows = part.shape.slice(0, -1).reduce((a, b) => a * b, 1);
  if (part.bytes.length !== rows * width) throw new InvalidMessageError(`an int8 hop of shape [${part.shape}] needs ${rows * width} bytes, got ${part.bytes.length}`);
  const q = new Uint8Array(rows * cols);
  const scales = new Uint8Array(4 * rows);
  for (let r = 0; r < rows; r++) {
    scales.set(part.bytes.subarray(r * width, r * width + 4), 4 * r);
    q.set(part.bytes.subarray(r * width + 4, (r + 1) * width), r * cols);
  }
  return tensor(decodeActivation({ codec: 'int8', shape, parts: [q, scales] }), shape);
}

/** What the receiver of `t` computes on once it crossed a hop encoded by `codec`. */
export function receivedAs(t: Tensor, codec: Exclude<ActivationCodec, 'none'>): Tensor {
  return tensor(roundTrip(t.data as Float32Array, t.shape, codec), t.shape);
}

/**
 * DCT top-k gradients among the holders of a parameter (`GradientCodec` of the pipeline's
 * exchange): each holder sends its gradient plus what it left out before (error feedback),
 * compressed; every holder adds the decompressed gradients of all, its own included, so all
 * end bit-identical.
 */
export class DctTopkCodec {
  readonly options: DctTopkOptions;
  /** One compressor (and its residuals) per k a tensor's blocks get. */
  private readonly compressors = new Map<number, GradientCompressor>();
  /** The residuals this step started from, per parameter encoded so far: put back if the step fails. */
  private readonly saved = new Map<string, { compressor: GradientCompressor; shape: number[]; data: Float32Array | undefined }>();

  constructor(options: Partial<DctTopkOptions> = {}) {
    this.options = checkDctTopk({ ...DCT_TOPK_DEFAULTS, ...options });
  }

  /**
   * Coefficients kept per block of a tensor of `shape`: k per chunk × chunk block, in proportion
   * for smaller blocks (a bias of 384 in blocks of 64 keeps 32 × 64 / 4096 → 1 each, not half of
   * them), so every tensor is sent at the same density.
   */
  kFor(shape: readonly number[]): number {
    const { k, chunk } = this.options;
    const { br, bc } = blockShape(shape, chunk);
    return Math.min(br * bc, Math.max(1, Math.round((k * br * bc) / (chunk * chunk))));
  }

  encode(name: string, grad: Tensor): { bytes: Uint8Array; own: Tensor } {
    const k = this.kFor(grad.shape);
    let compressor = this.compressors.get(k);
    if (!compressor) {
      compressor = new GradientCompressor({ ...this.options, k });
      this.compressors.set(k, compressor);
    }
    if (!this.saved.has(name)) this.saved.set(name, { compressor, shape: [...grad.shape], data: compressor.residual(name) });
    const c = compressor.compress(name, grad.data as Float32Array, grad.shape);
    return { bytes: encodeCompressed(c), own: tensor(decompressGradient(c), grad.shape) };
  }

  /** The step went through: what it left out is the error feedback of the next. */
  commit(): void {
    this.saved.clear();
  }

  /** The step failed: its retry starts from the residuals it started from (nothing it left out is counted twice). */
  rollback(): void {
    for (const [name, s] of this.saved) s.compressor.restore(name, s.shape, s.data);
    this.saved.clear();
  }

  /** Another holder's gradient of `name`, which must have `shape` (this holder's): any other is refused before anything is allocated. */
  decode(name: string, bytes: Uint8Array, shape: readonly number[]): Tensor {
    const c = decodeCompressed(bytes, shape);
    return tensor(decompressGradient(c), c.shape);
  }

  reset(): void {
    for (const c of this.compressors.values()) c.reset();
    this.saved.clear();
  }
}
