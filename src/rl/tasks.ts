/**
 * What a policy is rewarded for: prompts, a reward function over a completion's text, and held-out examples scored by
 * exact match. Built in: `addition` and `reverse` (exact answers: 1 or 0), and `json` (a record to write as JSON
 * following a schema: partial credit). A user's own task is a JS module (see loadTask).
 */
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { additionTask, type Example, reverseTask, type Task } from '../data/index.ts';
import { FileNotFoundError, InvalidArgumentError } from '../errors.ts';
import { Generator } from '../tensor/index.ts';
import { existsSync } from 'node:fs';

export interface RlTask {
  readonly name: string;
  /** The prompts rollouts are drawn from. */
  readonly prompts: readonly string[];
  /** Held-out prompts with the answer that scores 1 (exact match, greedy): the accuracy RL is judged by. */
  readonly test: readonly Example[];
  /** Ends a completion: what comes after it is not the completion's (a single token of the tokenizer). */
  readonly terminator: string;
  /** Tokens a completion may have, its terminator included. */
  readonly maxNewTokens: number;
  /** The reward of a completion (its text before the terminator) of a prompt: a finite number, 1 the best. */
  reward(prompt: string, completion: string): number | Promise<number>;
}

/** An exact-answer task's RL form: 1 for the answer, 0 for anything else. */
export function exactAnswerTask(task: Task, maxNewTokens: number): RlTask {
  const answers = new Map([...task.train, ...task.test].map((e) => [e.prompt, e.answer]));
  return {
    name: task.name,
    prompts: task.train.map((e) => e.prompt),
    test: task.test,
    terminator: task.terminator,
    maxNewTokens,
    reward: (prompt, completion) => (answers.get(prompt) === completion ? 1 : 0),
  };
}

/**
 * `json`: a record written as key=value pairs ("a=42 b=xy>") to be written as a JSON object following its schema
 * ({"a": integer, "b": string}): `{"a":42,"b":"xy"}`. Reward 1 for that object; 0.5 for an object of the schema (its
 * two keys, an integer and a string) with other values; 0.2 for any other JSON; 0 for text that does not parse.
 */
export function jsonTask(options: { seed?: number; testSize?: number } = {}): RlTask {
  const rng = new Generator(options.seed ?? 0);
  const all: Example[] = [];
  const seen = new Set<string>();
  while (all.length < 4000) {
    const a = rng.int(100);
    let b = '';
    for (let i = 0, n = 1 + rng.int(3); i < n; i++) b += String.fromCharCode(97 + rng.int(6));
    const prompt = `a=${a} b=${b}>`;
    if (seen.has(prompt)) continue;
    seen.add(prompt);
    all.push({ prompt, answer: JSON.stringify({ a, b }) });
  }
  const testSize = options.testSize ?? 200;
  const answers = new Map(all.map((e) => [e.prompt, e.answer]));
  return {
    name: 'json',
    prompts: all.slice(testSize).map((e) => e.prompt),
    test: all.slice(0, testSize),
    terminator: '\n',
    maxNewTokens: 20,
    reward(prompt, completion) {
      if (completion === answers.get(prompt)) return 1;
      let value: unknown;
      try {
        value = JSON.parse(completion);
      } catch {
        return 0;
      }
      const o = value as Record<string, unknown>;
      const schema = typeof o === 'object' && o !== null && !Array.isArray(o) && Object.keys(o).length === 2
        && Number.isInteger(o.a) && typeof o.b === 'string';
      return schema ? 0.5 : 0.2;
    },
  };
}

/** The built-in tasks by name: addition (2-digit sums, padded: "07+38=" → "045"), reverse, json. */
export function rlTaskByName(name: string, seed = 0): RlTask {
  if (name === 'addition') return exactAnswerTask(additionTask({ seed, padded: true }), 4);
  if (name === 'reverse') return exactAnswerTask(reverseTask({ seed }), 8);
  if (name === 'json') return jsonTask({ seed });
  throw new InvalidArgumentError(`unknown task '${name}': addition, reverse, json, or a .js/.mjs module of your own`);
}

/**
 * A task of one's own: a JS module (ESM) that exports `reward(prompt, completion)` (a number, or a promise of one) and
 * `prompts` (strings), and may export `test` ([{ prompt, answer }]: held out, scored by exact match), `terminator`
 * (default "\n") and `maxNewTokens` (default 16).
 */
export async function loadTask(path: string): Promise<RlTask> {
  const file = resolve(path);
  if (!existsSync(file)) throw new FileNotFoundError(`task module not found: ${file}`);
  const m = await import(pathToFileURL(file).href) as Record<string, unknown>;
  const bad = (what: string) => new InvalidArgumentError(`task module ${path}: ${what}`);
  if (typeof m.reward !== 'function') throw bad('it exports no reward(prompt, completion) function');
  if (!Array.isArray(m.prompts) || m.prompts.length === 0 || !m.prompts.every((p) => typeof p === 'string')) {
    throw bad('it exports no prompts: an array of strings');
  }
  const test = (m.test ?? []) as Example[];
  if (!Array.isArray(test) || !test.every((e) => typeof e?.prompt === 'string' && typeof e?.answer === 'string')) {
    throw bad('its test must be an array of { prompt, answer } strings');
  }
  const maxNewTokens = m.maxNewTokens ?? 16;
  if (!Number.isInteger(maxNewTokens) || (maxNewTokens as number) < 1) throw bad('its maxNewTokens must be a whole number ≥ 1');
  const reward = m.reward as (prompt: string, completion: string) => number | Promise<number>;
  return {
    name: path,
    prompts: m.prompts as string[],
    test,
    terminator: typeof m.terminator === 'string' ? m.terminator : '\n',
    maxNewTokens: maxNewTokens as number,
    reward: async (prompt, completion) => {
      const r = await reward(prompt, completion);
      if (typeof r !== 'number' || !Number.isFinite(r)) throw bad(`its reward gave ${String(r)} for ${JSON.stringify(completion)}: not a finite number`);
      return r;
    },
  };
}
