import { existsSync, readFileSync } from 'node:fs';
import { FileNotFoundError, InvalidArgumentError } from '../errors.ts';
import type { TextCodec } from './batches.ts';

/** A text file as tokens, split into a training part and a held-out tail (10% by default). */
export interface TextDataset {
  train: Int32Array;
  heldOut: Int32Array;
}

export function loadTextFile(path: string, codec: TextCodec, heldOutShare = 0.1): TextDataset {
  if (!existsSync(path)) throw new FileNotFoundError(`text file not found: ${path}`);
  const text = readFileSync(path, 'utf8');
  if (text.length === 0) throw new InvalidArgumentError(`${path} is empty`);
  const tokens = Int32Array.from(codec.encode(text));
  const cut = Math.floor(tokens.length * (1 - heldOutShare));
  return { train: tokens.subarray(0, cut), heldOut: tokens.subarray(cut) };
}
