/**
 * Speculative decoding across the swarm (issue #48): a model three hosts serve, each host reached through a delay relay
 * (test/helpers/delay-relay.ts) that holds every chunk 25 ms each way, so that every trip through the route costs what
 * hosts on other continents cost; greedy decoding without speculation against prompt-lookup drafts and drafts from a
 * weaker model of the same tokenizer that the user holds whole. Each figure is tokens per second against the same
 * route without speculation, measured in the same run; the tokens are asserted equal (js: bit for bit).
 *
 * The model is the perplexity section's (a 4×256 Llama trained on Debian's fortunes, bench/perplexity-model.ts: made
 * once, about an hour, then reused from bench/out/); the draft model is its first stage (800 steps, the same shape, a
 * worse model), which the user runs on onnxruntime (its own machine's fast backend; the hosts compute on js). Hosts
 * hold blocks 0–1, 2 and 3; each advertises only its relay's address, so the user and the other hosts reach it
 * through the relay. Text that repeats its prompt: the model's own answer to a line, then the line again (as an
 * answer asked for again, or edited code, repeats what it was given).
 */
import { dirname, join } from 'node:path';
import { createServer } from 'node:net';
import { existsSync } from 'node:fs';
import { fortunesDataset } from '../src/data/index.ts';
import { type Drafter, generate, loadModel, modelDrafter, type SpeculativeResult } from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { createOrtBackend, setBackend, withBackend } from '../src/tensor/index.ts';
import { HostedModel } from '../src/user/index.ts';
import { startValidator } from '../src/validator/index.ts';
import { parseHostSpec, startWorker, type Worker } from '../src/worker/index.ts';
import { type DelayRelay, startDelayRelay } from '../test/helpers/delay-relay.ts';
import type { Row } from './gemm.ts';
import { tokenizer, trainedModel } from './perplexity-model.ts';

/** One way, per chunk: a trip user → host → user gains 2 × this. */
const DELAY_MS = 25;
const SPANS = ['0-1', '2-2', '3-3'];
const log = (s: string) => process.stderr.write(`  speculative: ${s}\n`);

/** A free TCP port on 127.0.0.1 (for a host to listen on, so that its relay can be started before it). */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

export async function benchSpeculative(quick: boolean): Promise<Row[]> {
  setBackend('js');
  const trained = await trainedModel();
  const modelFile = trained.files.f32;
  const draftFile = join(dirname(dirname(modelFile)), 'llama-4x256-800-steps', 'model-f32.gguf');
  if (!existsSync(draftFile)) throw new Error(`the draft model ${draftFile} is missing: bench/perplexity-model.ts makes it`);
  const newTokens = quick ? 32 : 64;
  const validator = await startValidator();
  const boot = validator.node.getMultiaddrs()[0].toString();
  const relays: DelayRelay[] = [];
  const hosts: Worker[] = [];
  const rows: Row[] = [];
  const node = await createNode();
  try {
    for (const span of SPANS) {
      const port = await freePort();
      const relay = await startDelayRelay({ targetHost: '127.0.0.1', targetPort: port, delayMs: DELAY_MS });
      relays.push(relay);
      hosts.push(await startWorker({
        bootstrap: boot, listen: [`/ip4/127.0.0.1/tcp/${port}`], advertise: [`/ip4/127.0.0.1/tcp/${relay.port}`],
        host: [parseHostSpec(`fortunes=${modelFile}:${span}`)],
      }));
    }
    const ends = await loadModel(modelFile, { part: 'ends' });
    ends.tokenizer = tokenizer();
    // the user drafts on its own fast backend (onnxruntime), whatever the hosts compute on
    const drafter = modelDrafter(await loadModel(draftFile), ends.config.vocabSize);
    const ort = createOrtBackend({ threads: 1 });
    const draft: Drafter = { draft: (context, k) => withBackend(ort, () => drafter.draft(context, k) as number[]) };
    const model = await HostedModel.open(node, validator.node.getMultiaddrs()[0], 'fortunes', { ends, verify: { sampleRate: 0 } });
    const codec = ends.tokenizer;
    // a quote the model did not train on, and a text that repeats its prompt (a quote said again, as code and quotes are)
    const quote = fortunesDataset(codec).heldOut;
    const fortune = [...quote.slice(0, 200)];
    // text that repeats its prompt: the model's own answer to a question, then the question again (as an answer edited
    // or asked for again, or code, repeats much of what it was given)
    const line = codec.encode('A man who is his own lawyer ');
    const whole = await loadModel(modelFile);
    const answer = (await generate(whole, line, { maxNewTokens: 64, temperature: 0, stopTokens: [] })).tokens;
    const repeating = [...line, ...answer, ...codec.encode('\n\n'), ...line];
    const options = { maxNewTokens: newTokens, temperature: 0, stopTokens: [] };
    // warm: the route's connections, and every path's code compiled before anything is timed
    await model.generate(fortune, options);
    for (const drafts of ['lookup', draft] as const) await model.generateSpeculative(fortune, { ...options, draft: drafts });
    const cases = [['text that repeats its prompt', repeating, '≥ 2×', ''], ['fortunes (held out)', fortune, '', '≥ 1.5×']] as const;
    for (const [text, prompt, lookupTarget, draftTarget] of cases) {
      let t = performance.now();
      const plain = (await model.generate([...prompt], options)).tokens;
      const plainRate = plain.length / ((performance.now() - t) / 1000);
      log(`${text}: ${plain.length} tokens without speculation, ${plainRate.toFixed(1)} tok/s (${(1000 / plainRate).toFixed(0)} ms a token)`);
      for (const [how, drafts, target] of [['prompt lookup', 'lookup', lookupTarget], ['a draft model (800 steps)', draft, draftTarget]] as const) {
        t = performance.now();
        const r: SpeculativeResult = await model.generateSpeculative([...prompt], { ...options, draft: drafts });
        const rate = r.tokens.length / ((performance.now() - t) / 1000);
        if (r.tokens.join() !== plain.join()) throw new Error(`${how} on ${text}: the tokens differ from decoding without speculation`);
        const acceptance = r.drafted > 0 ? r.accepted / r.drafted : 0;
        log(`${text}, ${how}: ${r.tokens.length} tokens in ${r.passes} passes, ${r.accepted} of ${r.drafted} drafts accepted, ${rate.toFixed(1)} tok/s`);
        rows.push({
          section: 'speculative',
          case: `${how}, ${text}: 3 hosts ${DELAY_MS} ms away, greedy (${r.passes} passes for ${r.tokens.length} tokens, ${(100 * acceptance).toFixed(0)}% of drafts accepted)`,
          value: rate, unit: 'tok/s', reference: 'the same route without speculation', referenceValue: plainRate, ratio: rate / plainRate,
          ...(target ? { target } : {}),
        });
      }
    }
    await model.close();
  } finally {
    await node.stop();
    await Promise.all(hosts.map((h) => h.stop()));
    await Promise.all(relays.map((r) => r.close()));
    await validator.stop();
  }
  return rows;
}
