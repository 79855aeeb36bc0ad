import { InvalidArgumentError } from '../errors.ts';
import { type Generator, type Tensor, tensor } from '../tensor/index.ts';
import type { Example, Task } from './tasks.ts';

/** A training batch for a causal LM: input ids and the target of every position (−100: no loss). */
export interface Batch {
  input: Tensor;
  target: Tensor;
}

export interface TextCodec {
  encode(text: string): number[];
}

export const IGNORE_INDEX = -100;

/**
 * Draws `size` task examples (seeded) and lays them out as prompt + answer + terminator,
 * right-padded with `padId`. Only the answer and terminator carry loss.
 */
export function taskBatch(task: Task, codec: TextCodec, rng: Generator, size: number, padId: number): Batch {
  const rows = Array.from({ length: size }, () => task.train[rng.int(task.train.length)]);
  return exampleBatch(rows, task.terminator, codec, padId);
}

export function exampleBatch(rows: readonly Example[], terminator: string, codec: TextCodec, padId: number): Batch {
  const encoded = rows.map((e) => {
    const prompt = codec.encode(e.prompt);
    const answer = codec.encode(e.answer + terminator);
    return { ids: [...prompt, ...answer], promptLength: prompt.length };
  });
  const t = Math.max(...encoded.map((e) => e.ids.length)) - 1;
  const input = new Int32Array(rows.length * t).fill(padId);
  const target = new Int32Array(rows.length * t).fill(IGNORE_INDEX);
  encoded.forEach((e, r) => {
    for (let i = 0; i < e.ids.length - 1; i++) {
      input[r * t + i] = e.ids[i];
      // position i predicts token i + 1; only answer tokens are scored
      if (i + 1 >= e.promptLength) target[r * t + i] = e.ids[i + 1];
    }
  });
  return { input: tensor(input, [rows.length, t], 'int32'), target: tensor(target, [rows.length, t], 'int32') };
}

/**
 * A token stream cut into random windows (seeded): input = tokens[s, s+T),
 * target = tokens[s+1, s+T+1).
 */
export function textBatch(tokens: readonly number[] | Int32Array, rng: Generator, size: number, length: number): Batch {
  if (tokens.length < length + 2) {
    throw new InvalidArgumentError(`the text has ${tokens.length} tokens, fewer than one window of ${length + 1}`);
  }
  const input = new Int32Array(size * length);
  const target = new Int32Array(size * length);
  for (let r = 0; r < size; r++) {
    const start = rng.int(tokens.length - length - 1);
    for (let i = 0; i < length; i++) {
      input[r * length + i] = tokens[start + i];
      target[r * length + i] = tokens[start + i + 1];
    }
  }
  return { input: tensor(input, [size, length], 'int32'), target: tensor(target, [size, length], 'int32') };
}
