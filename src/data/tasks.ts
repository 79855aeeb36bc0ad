import { InvalidArgumentError } from '../errors.ts';
import { Generator } from '../tensor/index.ts';

/**
 * Synthetic tasks with exact answers, so learning can be shown without downloaded data.
 * Each example is a prompt and its answer as text ("12+45=" → "57"); a model learns to
 * continue the prompt with the answer and a newline.
 */
export interface Example {
  prompt: string;
  answer: string;
}

export interface Task {
  readonly name: string;
  /** Examples the model trains on. */
  readonly train: readonly Example[];
  /** Held-out examples, never seen in training. */
  readonly test: readonly Example[];
  /** Ends every answer. */
  readonly terminator: string;
}

export type TaskName = 'addition' | 'reverse';

/** Integer addition of numbers with up to `digits` digits: "123+45=" → "168". */
export function additionTask(options: { digits?: number; seed?: number; testSize?: number; padded?: boolean } = {}): Task {
  const digits = options.digits ?? 2;
  if (digits < 1 || digits > 4) throw new InvalidArgumentError('addition digits must be between 1 and 4');
  const limit = 10 ** digits;
  const all: Example[] = [];
  // padded: fixed width, "07+38=045", so that every digit has its own position
  const num = (n: number, width: number) => (options.padded ? String(n).padStart(width, '0') : String(n));
  for (let a = 0; a < limit; a++) {
    for (let b = 0; b < limit; b++) all.push({ prompt: `${num(a, digits)}+${num(b, digits)}=`, answer: num(a + b, digits + 1) });
  }
  return split(options.padded ? 'addition-padded' : 'addition', all, options.seed ?? 0, options.testSize ?? 500);
}

/** Reversal of a lowercase word of 3–`maxLength` letters: "abcd>" → "dcba". */
export function reverseTask(options: { maxLength?: number; seed?: number; count?: number; testSize?: number } = {}): Task {
  const rng = new Generator(options.seed ?? 0);
  const maxLength = options.maxLength ?? 6;
  const seen = new Set<string>();
  const all: Example[] = [];
  const count = options.count ?? 20000;
  while (all.length < count) {
    const n = 3 + rng.int(maxLength - 2);
    let w = '';
    for (let i = 0; i < n; i++) w += String.fromCharCode(97 + rng.int(8));
    if (seen.has(w)) continue;
    seen.add(w);
    all.push({ prompt: `${w}>`, answer: [...w].reverse().join('') });
  }
  return split('reverse', all, (options.seed ?? 0) + 1, options.testSize ?? 500);
}

function split(name: string, all: Example[], seed: number, testSize: number): Task {
  new Generator(seed).shuffle(all);
  return { name, test: all.slice(0, testSize), train: all.slice(testSize), terminator: '\n' };
}

export function taskByName(name: string, seed = 0): Task {
  if (name === 'addition') return additionTask({ seed });
  if (name === 'addition-padded') return additionTask({ seed, padded: true });
  if (name === 'reverse') return reverseTask({ seed });
  throw new InvalidArgumentError(`unknown task '${name}' (addition, addition-padded, reverse)`);
}

/** The share of predictions that equal their answers exactly. */
export function exactMatch(predictions: readonly string[], answers: readonly string[]): number {
  if (predictions.length !== answers.length) throw new InvalidArgumentError('predictions and answers differ in number');
  if (answers.length === 0) return 0;
  return predictions.filter((p, i) => p === answers[i]).length / answers.length;
}
