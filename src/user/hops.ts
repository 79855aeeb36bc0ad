import { decodeHop, encodeHop, receivedAs } from '../compress/index.ts';
import { fromWire, toWire, type WireActivationCodec, type WireTensor } from '../p2p/index.ts';
import type { Tensor } from '../tensor/index.ts';

/** A training hop's tensor as it arrived: float32 or ids, or encoded (its dtype says how), restored to float32. */
export function hopTensor(wire: WireTensor): Tensor {
  if (wire.dtype === 'float16' || wire.dtype === 'int8') return decodeHop({ dtype: wire.dtype, shape: wire.shape, bytes: wire.bytes });
  return fromWire(wire);
}

/** A training hop's tensor as it leaves: float32, or encoded by `codec` (token ids never are). */
export function hopWire(t: Tensor, requestId: number, codec: WireActivationCodec | null): WireTensor {
  if (codec === null || t.dtype !== 'float32') return toWire(t, requestId);
  return { requestId, ...encodeHop(t, codec) };
}

/** What the receiver of `t` computes on after `codec` (the hash its record names). */
export function asReceived(t: Tensor, codec: WireActivationCodec | null): Tensor {
  if (codec === null || t.dtype !== 'float32') return t;
  return receivedAs(t, codec);
}
