import { InvalidMessageError } from '../errors.ts';
import { Tensor } from '../tensor/index.ts';
import type { WireTensor } from './frames.ts';

/** Tensor ↔ wire frame: the one place where the network meets the engine. */
export function toWire(t: Tensor, requestId: number): WireTensor {
  const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  return { requestId, dtype: t.dtype, shape: [...t.shape], bytes };
}

export function fromWire(w: WireTensor): Tensor {
  // a copy of exactly these bytes: aligned, and no longer tied to the receive buffer. Not `.slice()`:
  // on a Node Buffer (what sockets deliver) slice is a view, and the view's buffer is a whole pool slab
  const copy = new Uint8Array(w.bytes);
  switch (w.dtype) {
    case 'float32':
      return new Tensor(new Float32Array(copy.buffer), w.shape);
    case 'float64':
      return new Tensor(new Float64Array(copy.buffer), w.shape);
    case 'int32':
      return new Tensor(new Int32Array(copy.buffer), w.shape);
    default:
      throw new InvalidMessageError(`${w.dtype} tensors are storage only; send float32, float64 or int32`);
  }
}
