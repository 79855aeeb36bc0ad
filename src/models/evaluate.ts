import { InvalidArgumentError } from '../errors.ts';
import { generateBatch, type GenerateOptions } from './generation/generate.ts';
import type { CausalLM } from './model.ts';
import type { Tokenizer } from './tokenizer.ts';

/** Anything that continues prompts in batches: a model, or a model split across workers. */
export interface BatchGenerator {
  tokenizer: Tokenizer | null;
  generateBatch(prompts: number[][], options: GenerateOptions): Promise<{ tokens: number[][] }>;
}

function asGenerator(model: CausalLM | BatchGenerator): BatchGenerator {
  if (!('forward' in model)) return model;
  model.eval();
  return { tokenizer: model.tokenizer, generateBatch: (prompts, options) => generateBatch(model, prompts, options) };
}

export interface EvalResult {
  accuracy: number;
  predictions: string[];
}

/**
 * Exact-match accuracy of greedy continuations: each prompt is continued until the
 * terminator (one token) and the text before it is compared with the answer.
 */
export async function evaluateExactMatch(
  model: CausalLM | BatchGenerator,
  examples: readonly { prompt: string; answer: string }[],
  options: { terminator: string; maxNewTokens: number; batchSize?: number },
): Promise<EvalResult> {
  const generator = asGenerator(model);
  const tok = generator.tokenizer;
  if (!tok) throw new InvalidArgumentError('the model has no tokenizer (tokenizer.json) to evaluate with');
  const stop = tok.encode(options.terminator);
  if (stop.length !== 1) throw new InvalidArgumentError(`the terminator must be a single token, got ${stop.length}`);
  const predictions: string[] = [];
  const size = options.batchSize ?? 64;
  for (let i = 0; i < examples.length; i += size) {
    const chunk = examples.slice(i, i + size);
    const { tokens } = await generator.generateBatch(
      chunk.map((e) => tok.encode(e.prompt)),
      { maxNewTokens: options.maxNewTokens, stopTokens: stop },
    );
    for (const seq of tokens) {
      const cut = seq.indexOf(stop[0]);
      predictions.push(tok.decode(cut >= 0 ? seq.slice(0, cut) : seq));
    }
  }
  const correct = predictions.filter((p, i) => p === examples[i].answer).length;
  return { accuracy: correct / Math.max(1, examples.length), predictions };
}
