export { additionTask, type Example, exactMatch, reverseTask, type Task, type TaskName, taskByName } from './tasks.ts';
export { type Batch, exampleBatch, IGNORE_INDEX, type TextCodec, taskBatch, textBatch } from './batches.ts';
export { loadTextFile, type TextDataset } from './text.ts';
export {
  CORPORA,
  corpusByName,
  type CorpusName,
  DEFAULT_HELD_OUT_SHARE,
  fortuneQuotes,
  FORTUNES_DIR,
  fortunesDataset,
  HELD_OUT_EVAL_TOKENS,
  type HeldOutLoss,
  heldOutLoss,
  isCorpusName,
  isHeldOutQuote,
  loadFortunes,
  QUOTE_SEPARATOR,
  splitQuotes,
} from './corpus.ts';
