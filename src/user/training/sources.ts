/** What a training run learns from and how it is scored: a task with exact answers, or text with a held-out part. */
import {
  type Batch, corpusByName, heldOutLoss, isCorpusName, loadTextFile, type Task, taskBatch, textBatch, type TextDataset,
} from '../../data/index.ts';
import { type BatchGenerator, type CausalLM, evaluateExactMatch, type Tokenizer } from '../../models/index.ts';
import type { Generator, Tensor } from '../../tensor/index.ts';

/** How a source evaluates the model being trained: its logits, and a generator that continues prompts (locally, or across the workers). */
export interface Evaluator {
  logits(ids: Tensor): Promise<Tensor>;
  generator: CausalLM | BatchGenerator;
}

/** An evaluation: exact-match accuracy on a task, or held-out loss (and its perplexity) on text. */
export interface Evaluation {
  metric: 'accuracy' | 'loss';
  value: number;
  perplexity?: number;
}

/** A run's data: its name (a checkpoint remembers it), its batches (drawn from `rng`) and its evaluation. */
export interface TrainingSource {
  name: string;
  batch(rng: Generator): Batch;
  /** A batch of held-out data no step trains on (what a replica's change is scored on: user/scoring.ts). */
  heldOutBatch(rng: Generator): Batch;
  evaluate(model: Evaluator): Promise<Evaluation>;
}

/**
 * Batches of a task's examples; an evaluation is exact match on the first `evalSize` held-out examples.
 * @example
 * const source = taskSource(taskByName('addition', 0), model.tokenizer!, 32, 200)
 */
export function taskSource(task: Task, tok: Tokenizer, batchSize: number, evalSize: number): TrainingSource {
  const pad = tok.eosTokenId ?? 0;
  const maxAnswer = Math.max(...task.test.map((e) => tok.encode(e.answer).length)) + 1;
  return {
    name: `task:${task.name}`,
    batch: (rng) => taskBatch(task, tok, rng, batchSize, pad),
    heldOutBatch: (rng) => taskBatch({ ...task, train: task.test }, tok, rng, batchSize, pad),
    evaluate: async ({ generator }) => {
      const examples = task.test.slice(0, evalSize);
      const options = { terminator: task.terminator, maxNewTokens: maxAnswer, batchSize: 250 };
      const { accuracy } = await evaluateExactMatch(generator, examples, options);
      return { metric: 'accuracy', value: accuracy };
    },
  };
}

/** Held-out tokens an evaluation scores (the same windows every time, so runs compare): enough for a loss within about 1%. */
export const EVAL_TOKENS = 16_384;

/**
 * Windows of `seqLen` tokens of a text; an evaluation is the loss (and perplexity) on its held-out part.
 * @example
 * const source = textSource('notes.txt', textData('notes.txt', tok), 32, 128)
 */
export function textSource(path: string, data: TextDataset, batchSize: number, seqLen: number): TrainingSource {
  return {
    name: `data:${path}`,
    batch: (rng) => textBatch(data.train, rng, batchSize, seqLen),
    heldOutBatch: (rng) => textBatch(data.heldOut.length > seqLen + 2 ? data.heldOut : data.train, rng, batchSize, seqLen),
    evaluate: async (m) => {
      const heldOut = data.heldOut.length > seqLen + 2 ? data.heldOut : data.train;
      const r = await heldOutLoss(async (ids) => m.logits(ids), heldOut, { seqLen, batchSize, windows: Math.ceil(EVAL_TOKENS / seqLen) });
      return { metric: 'loss', value: r.loss, perplexity: r.perplexity };
    },
  };
}

/**
 * A corpus this machine has (Debian's fortunes) by its name, or a text file.
 * @example
 * const data = textData('fortunes', tok)
 */
export function textData(name: string, codec: Tokenizer): TextDataset {
  return isCorpusName(name) ? corpusByName(name)(codec) : loadTextFile(name, codec);
}
