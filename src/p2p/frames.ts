import { InvalidMessageError } from '../errors.ts';
import { MAX_CONTROL_BYTES, MAX_FRAME_BYTES, MAX_TENSOR_RANK } from './constants.ts';

/**
 * The wire format of TensorLink's streams: length-prefixed frames,
 *   [u32 length][u8 kind][payload]            (little-endian; length counts kind + payload)
 * kind 1 = control: UTF-8 JSON, validated by the receiver's schema;
 * kind 2 = tensor:  [u32 request id][u8 dtype][u8 rank][rank × u32 dims][raw little-endian bytes].
 * Tensors never pass through JSON or base64. Everything here is pure and rejects bad
 * input with InvalidMessageError.
 */

export const FRAME_CONTROL = 1;
export const FRAME_TENSOR = 2;

/** dtype codes on the wire. */
/** int8: activations quantised per row (with their scales); uint8: opaque bytes of a codec (compressed gradients). */
export const WIRE_DTYPES = ['float32', 'float64', 'int32', 'float16', 'bfloat16', 'int8', 'uint8'] as const;
export type WireDType = (typeof WIRE_DTYPES)[number];
const WIDTH: Record<WireDType, number> = { float32: 4, float64: 8, int32: 4, float16: 2, bfloat16: 2, int8: 1, uint8: 1 };

/** A tensor as the network sees it: no engine types, just a dtype, a shape and bytes. */
export interface WireTensor {
  requestId: number;
  dtype: WireDType;
  shape: number[];
  /** Little-endian element bytes, exactly size × width. */
  bytes: Uint8Array;
}

export type Frame = { kind: 'control'; message: unknown } | { kind: 'tensor'; tensor: WireTensor };

function header(length: number, kind: number): Uint8Array {
  const h = new Uint8Array(5);
  const view = new DataView(h.buffer);
  view.setUint32(0, length, true);
  h[4] = kind;
  return h;
}

/** Encodes a control message as one frame. */
export function encodeControl(message: unknown): Uint8Array {
  const body = new TextEncoder().encode(JSON.stringify(message));
  if (body.length > MAX_CONTROL_BYTES) throw new InvalidMessageError(`control message of ${body.length} bytes exceeds ${MAX_CONTROL_BYTES}`);
  const out = new Uint8Array(5 + body.length);
  out.set(header(1 + body.length, FRAME_CONTROL), 0);
  out.set(body, 5);
  return out;
}

/** Encodes a tensor as [header, payload] parts (the payload is not copied). */
export function encodeTensor(t: WireTensor): Uint8Array[] {
  const code = WIRE_DTYPES.indexOf(t.dtype);
  if (code < 0) throw new InvalidMessageError(`dtype ${t.dtype} cannot be sent`);
  if (t.shape.length > MAX_TENSOR_RANK) throw new InvalidMessageError(`rank ${t.shape.length} exceeds ${MAX_TENSOR_RANK}`);
  const size = t.shape.reduce((a, b) => a * b, 1);
  if (t.bytes.length !== size * WIDTH[t.dtype]) throw new InvalidMessageError('tensor bytes do not match its shape');
  const meta = new Uint8Array(6 + 4 * t.shape.length);
  const view = new DataView(meta.buffer);
  view.setUint32(0, t.requestId >>> 0, true);
  meta[4] = code;
  meta[5] = t.shape.length;
  t.shape.forEach((d, i) => view.setUint32(6 + 4 * i, d, true));
  const length = 1 + meta.length + t.bytes.length;
  if (length > MAX_FRAME_BYTES) throw new InvalidMessageError(`tensor frame of ${length} bytes exceeds ${MAX_FRAME_BYTES}`);
  const head = new Uint8Array(5 + meta.length);
  head.set(header(length, FRAME_TENSOR), 0);
  head.set(meta, 5);
  return [head, t.bytes];
}

/** Decodes one frame body (kind byte + payload, without the length prefix). */
export function decodeFrame(body: Uint8Array): Frame {
  if (body.length < 1) throw new InvalidMessageError('empty frame');
  const kind = body[0];
  const payload = body.subarray(1);
  if (kind === FRAME_CONTROL) {
    if (payload.length > MAX_CONTROL_BYTES) throw new InvalidMessageError('control message too large');
    let message: unknown;
    try {
      message = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(payload));
    } catch {
      throw new InvalidMessageError('control message is not valid UTF-8 JSON');
    }
    return { kind: 'control', message };
  }
  if (kind === FRAME_TENSOR) {
    if (payload.length < 6) throw new InvalidMessageError('tensor frame too short');
    const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
    const requestId = view.getUint32(0, true);
    const dtype = WIRE_DTYPES[payload[4]];
    if (dtype === undefined) throw new InvalidMessageError(`unknown dtype code ${payload[4]}`);
    const rank = payload[5];
    if (rank > MAX_TENSOR_RANK) throw new InvalidMessageError(`rank ${rank} exceeds ${MAX_TENSOR_RANK}`);
    if (payload.length < 6 + 4 * rank) throw new InvalidMessageError('tensor frame too short for its rank');
    const shape: number[] = [];
    let size = 1;
    for (let i = 0; i < rank; i++) {
      const d = view.getUint32(6 + 4 * i, true);
      shape.push(d);
      size *= d;
    }
    const bytes = payload.subarray(6 + 4 * rank);
    if (bytes.length !== size * WIDTH[dtype]) {
      throw new InvalidMessageError(`tensor [${shape}] ${dtype} needs ${size * WIDTH[dtype]} bytes, frame has ${bytes.length}`);
    }
    return { kind: 'tensor', tensor: { requestId, dtype, shape, bytes } };
  }
  throw new InvalidMessageError(`unknown frame kind ${kind}`);
}

/**
 * Reassembles frames from stream chunks of any size. `push` returns the frame bodies
 * completed by the chunk; a length beyond MAX_FRAME_BYTES is an InvalidMessageError (the
 * caller resets the stream: its framing can no longer be trusted).
 */
export class FrameReader {
  private chunks: Uint8Array[] = [];
  private buffered = 0;
  private expected = -1;

  constructor(private readonly maxFrameBytes = MAX_FRAME_BYTES) {}

  push(chunk: Uint8Array): Uint8Array[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const frames: Uint8Array[] = [];
    for (;;) {
      if (this.expected < 0) {
        if (this.buffered < 4) break;
        const len = this.take(4);
        const length = new DataView(len.buffer, len.byteOffset, 4).getUint32(0, true);
        if (length === 0 || length > this.maxFrameBytes) {
          throw new InvalidMessageError(`frame length ${length} is outside 1..${this.maxFrameBytes}`);
        }
        this.expected = length;
      }
      if (this.buffered < this.expected) break;
      frames.push(this.take(this.expected));
      this.expected = -1;
    }
    return frames;
  }

  /** Removes and returns the next n buffered bytes (copying only when they span chunks). */
  private take(n: number): Uint8Array {
    this.buffered -= n;
    const first = this.chunks[0];
    if (first.length >= n) {
      const out = first.subarray(0, n);
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
      return out;
    }
    const out = new Uint8Array(n);
    let filled = 0;
    while (filled < n) {
      const c = this.chunks[0];
      const part = Math.min(c.length, n - filled);
      out.set(c.subarray(0, part), filled);
      filled += part;
      if (part === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(part);
    }
    return out;
  }
}
