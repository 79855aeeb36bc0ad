export * from './constants.ts';
export {
  decodeFrame,
  encodeControl,
  encodeTensor,
  FRAME_CONTROL,
  FRAME_TENSOR,
  type Frame,
  FrameReader,
  WIRE_DTYPES,
  type WireDType,
  type WireTensor,
} from './frames.ts';
export { IDENTITY_FILE, loadOrCreateIdentity } from './identity.ts';
export { createNode, type NodeOptions, type TensorLinkNode } from './node.ts';
export { receiveFrames, sendMessage, sendParts } from './stream.ts';
