/**
 * Generation across workers: start a local swarm (a validator and two workers, each its own
 * process), split a model over the workers (you keep the embedding and the head), and
 * generate token by token across them: the same tokens as in one process.
 *   node --import tsx examples/distributed-generation.ts
 */
import { byteLevelTokenizerJson, createModel, generate, HFTokenizer, llamaConfig, localSwarm } from '../src/index.ts';

const tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const config = llamaConfig({ vocabSize: 257, hidden: 64, layers: 4, heads: 4, kvHeads: 2, intermediate: 128, maxPositions: 64 });
const model = createModel(config, { seed: 3 });
model.tokenizer = tokenizer;
const prompt = tokenizer.encode('Hello, swarm');

const swarm = await localSwarm({ workers: 2 });
try {
  const dm = await swarm.user.distribute(model, { strategy: 'parameter-balanced' });
  for (const a of dm.assignment) console.log(`worker …${a.peerId.slice(-6)} holds layers ${a.start}–${a.end - 1}`);
  const streamed: number[] = [];
  const { tokens } = await dm.generate(prompt, { maxNewTokens: 12, stopTokens: [], onToken: (t) => streamed.push(t) });
  const local = await generate(model, prompt, { maxNewTokens: 12, stopTokens: [] });
  console.log(`across the swarm: ${JSON.stringify(tokens)}`);
  console.log(`in one process:   ${JSON.stringify(local.tokens)}`);
  console.log(tokens.join() === local.tokens.join() ? 'same tokens' : 'DIFFERENT tokens');
  if (tokens.join() !== local.tokens.join()) process.exitCode = 1;
  await dm.close();
} finally {
  await swarm.close();
}
