/** The network layer: nodes, frames, streams, the shared vocabulary and one folder per protocol. */
export * from './constants.ts';
export { type DialTarget, dialAddrs, dialProtocol, targetName } from './dial.ts';
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
export { createLogger, isLogLevel, type Logger, type LogLevel } from './log.ts';
export { createNode, DHT_PROTOCOL, type NodeOptions, publicKeyOf, signerOf, type TensorLinkNode } from './node.ts';
export { PeerRateLimiter } from './rate-limit.ts';
export { finite, int, list, obj, oneOf, optional, peerIdText, str, strings } from './schema.ts';
export { RequestTable } from './requests.ts';
export { receiveFrames, type SendOptions, sendMessage, sendParts, sendQuietly, traffic } from './stream.ts';
export * from './vocabulary.ts';
export { errorFromWire, errorToWire, isWireError, type WireError } from './wire-errors.ts';
export { fromWire, toWire } from './wire-tensor.ts';
export * from './protocols/control/constants.ts';
export { type Handler, serveControl } from './protocols/control/server.ts';
export { request } from './protocols/control/client.ts';
export * from './protocols/control/schema.ts';
export * from './protocols/probe/constants.ts';
export { probe, serveProbes } from './protocols/probe/probe.ts';
export * from './protocols/result/constants.ts';
export { parseResult, type ResultMessage } from './protocols/result/schema.ts';
export * from './protocols/stage/constants.ts';
export { chunksOf, HEX64, sha256, type WeightEntry } from './protocols/stage/chunks.ts';
export * from './protocols/stage/schema.ts';
export * from './protocols/control/overview.ts';
