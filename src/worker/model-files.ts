/**
 * The files a host serves beside a model's weights (config.json, the tokenizer's), read once: the model's hash covers
 * them as read, and the ends server sends those same bytes.
 */
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { GGUFModel, isGGUF } from '../models/index.ts';
import { ENDS_FILES, type EndsFile } from '../p2p/index.ts';

/** A model's files by name, as a host serves them. */
export type ModelFiles = Map<EndsFile['name'], Uint8Array>;

/** The config and tokenizer files of a checkpoint directory, or a GGUF file's as Hugging Face would hold them. */
export function modelFiles(path: string): ModelFiles {
  const files: ModelFiles = new Map();
  if (isGGUF(path)) {
    const file = GGUFModel.open(path);
    try {
      files.set('config.json', new TextEncoder().encode(JSON.stringify(file.config)));
      const tok = file.tokenizer();
      if (tok) files.set('tokenizer.json', new TextEncoder().encode(JSON.stringify(tok.json)));
    } finally {
      file.close();
    }
    return files;
  }
  for (const name of ENDS_FILES) {
    if (existsSync(join(path, name))) files.set(name, readFileSync(join(path, name)));
  }
  return files;
}

/** Each file's name, size and sha256, in name order (what a manifest lists, and the model's hash covers). */
export function listFiles(files: ModelFiles): EndsFile[] {
  return [...files].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([name, bytes]) => ({ name, bytes: bytes.byteLength, sha256: createHash('sha256').update(bytes).digest('hex') }));
}
