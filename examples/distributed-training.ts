/**
 * Training across workers: a local swarm of three workers, each holding one block of a
 * GPT-2; micro-batches flow through a 1F1B pipeline; the trained weights come back and are
 * saved in Hugging Face layout.
 *   node --import tsx examples/distributed-training.ts [steps]
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  additionTask, byteLevelTokenizerJson, createModel, createNode, distribute, Generator, gpt2Config, HFTokenizer, localSwarm, saveModel,
  taskBatch,
} from '../src/index.ts';

const steps = Number(process.argv[2] ?? 40);
const tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const model = createModel(gpt2Config({ vocabSize: 257, hidden: 64, layers: 3, heads: 4, maxPositions: 32 }), { seed: 1 });
model.tokenizer = tokenizer;
const task = additionTask({ padded: true });

const swarm = await localSwarm({ workers: 3 });
const user = await createNode();
try {
  const dm = await distribute(user, swarm.bootstrap, model, { strategy: 'parameter-balanced' });
  const trainer = await dm.trainer({ optimizer: { name: 'adamw', lr: 6e-3 }, totalSteps: steps, microBatches: 4, schedule: '1f1b' });
  const rng = new Generator(2);
  for (let step = 1; step <= steps; step++) {
    const r = await trainer.step(taskBatch(task, tokenizer, rng, 64, tokenizer.eosTokenId ?? 0));
    if (step % 10 === 0 || step === steps) console.log(`step ${step}  loss ${r.loss.toFixed(4)}  ${(r.seconds * 1000).toFixed(0)} ms`);
  }
  const dir = join(mkdtempSync(join(tmpdir(), 'tensorlink-example-')), 'trained');
  await saveModel(await dm.pull(), dir);
  console.log(`trained weights saved to ${dir}`);
  await dm.close();
} finally {
  await user.stop();
  await swarm.close();
}
