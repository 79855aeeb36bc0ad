/**
 * Compression for the wire: DCT + top-k gradients with error feedback (gradient.ts, over
 * dct.ts and topk.ts) and activation codecs between pipeline stages (activation.ts).
 * Pure functions over Float32Array; every bad input is a typed error.
 */
export {
  ACTIVATION_CODECS,
  type ActivationCodec,
  activationBytes,
  decodeActivation,
  type EncodedActivation,
  encodeActivation,
  parseActivationCodec,
  roundTrip,
} from './activation.ts';
export {
  type BlockLayout,
  blockShape,
  blockSide,
  dctBasis,
  dctBlocks,
  idctBlocks,
  matrixView,
  MAX_CHUNK,
  MAX_ELEMENTS,
  MAX_RANK,
} from './dct.ts';
export {
  checkDctTopk,
  type CompressedGradient,
  compressedBytes,
  DCT_TOPK_DEFAULTS,
  DCT_TOPK_FORM,
  type DctTopkOptions,
  decodeCompressed,
  decompressGradient,
  denseBytes,
  encodeCompressed,
  type GradientBits,
  GradientCompressor,
  parseDctTopk,
} from './gradient.ts';
export { MAX_BLOCK_SIZE, type TopK, topkBlocks } from './topk.ts';
export { DctTopkCodec, decodeHop, encodeHop, hopIn, hopOut, type HopPart, receivedAs } from './hop.ts';
