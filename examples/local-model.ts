/**
 * A model on one machine: create a small GPT-2, train it on 2-digit addition, save it in
 * Hugging Face layout, load it back and ask it a sum.
 *   node --import tsx examples/local-model.ts [steps]
 * (In your own project: import { ... } from 'tensorlink'.)
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  additionTask, byteLevelTokenizerJson, createModel, evaluateExactMatch, Generator, generate, gpt2Config, HFTokenizer, loadModel,
  LocalTrainer, saveModel, taskBatch,
} from '../src/index.ts';

const steps = Number(process.argv[2] ?? 300);
const tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const model = createModel(gpt2Config({ vocabSize: 257, hidden: 64, layers: 2, heads: 4, maxPositions: 32 }), { seed: 1 });
model.tokenizer = tokenizer;
const task = additionTask({ padded: true });
const trainer = new LocalTrainer(model, { lr: 6e-3, totalSteps: steps });
const rng = new Generator(2);
for (let step = 1; step <= steps; step++) {
  const { loss } = trainer.step(taskBatch(task, tokenizer, rng, 64, tokenizer.eosTokenId ?? 0));
  if (step % 100 === 0 || step === steps) console.log(`step ${step}  loss ${loss.toFixed(4)}`);
}
const dir = join(mkdtempSync(join(tmpdir(), 'tensorlink-example-')), 'adder');
await saveModel(model, dir);
const loaded = await loadModel(dir);
const { accuracy } = await evaluateExactMatch(loaded, task.test.slice(0, 200), { terminator: '\n', maxNewTokens: 4 });
const { tokens } = await generate(loaded, tokenizer.encode('47+38='), { maxNewTokens: 4, stopTokens: tokenizer.encode('\n') });
console.log(`saved to ${dir}; exact match on 200 held-out sums: ${(100 * accuracy).toFixed(1)}%; 47+38=${tokenizer.decode(tokens).trim()}`);
