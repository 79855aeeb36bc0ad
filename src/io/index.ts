export {
  Checkpoint,
  INDEX_FILE,
  readSafetensors,
  SafetensorsReader,
  SINGLE_FILE,
  type WriteOptions,
  writeCheckpoint,
  writeSafetensors,
} from './safetensors.ts';
export type { SafeDType } from './safetensors-format.ts';
