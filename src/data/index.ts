export { additionTask, type Example, exactMatch, reverseTask, type Task, type TaskName, taskByName } from './tasks.ts';
export { type Batch, exampleBatch, IGNORE_INDEX, type TextCodec, taskBatch, textBatch } from './batches.ts';
export { loadTextFile, type TextDataset } from './text.ts';
