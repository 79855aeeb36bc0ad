export {
  Checkpoint,
  INDEX_FILE,
  type PlannedTensor,
  planShards,
  readSafetensors,
  SafetensorsReader,
  SafetensorsWriter,
  SINGLE_FILE,
  type WriteOptions,
  writeCheckpoint,
  writeSafetensors,
  writeShardIndex,
} from './safetensors.ts';
export type { SafeDType } from './safetensors-format.ts';
export {
  GGUFMeta, type GGUFPlannedTensor, GGUFReader, type GGUFTensorData, type GGUFValue, GGUFWriter, type GGUFWriteType, writeGGUF,
} from './gguf.ts';
