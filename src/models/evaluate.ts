import { InvalidArgumentError } from '../errors.ts';
import { generateBatch } from './generate.ts';
import type { CausalLM } from './model.ts';

export interface EvalResult {
  accuracy: number;
  predictions: string[];
}

/**
 * Exact-match accuracy of greedy continuations: each prompt is continued until the
 * terminator (one token) and the text before it is compared with the answer.
 */
export async function evaluateExactMatch(
  model: CausalLM,
  examples: readonly { prompt: string; answer: string }[],
  options: { terminator: string; maxNewTokens: number; batchSize?: number },
): Promise<EvalResult> {
  const tok = model.tokenizer;
  if (!tok) throw new InvalidArgumentError('the model has no tokenizer (tokenizer.json) to evaluate with');
  const stop = tok.encode(options.terminator);
  if (stop.length !== 1) throw new InvalidArgumentError(`the terminator must be a single token, got ${stop.length}`);
  model.eval();
  const predictions: string[] = [];
  const size = options.batchSize ?? 64;
  for (let i = 0; i < examples.length; i += size) {
    const chunk = examples.slice(i, i + size);
    const { tokens } = await generateBatch(
      model,
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
