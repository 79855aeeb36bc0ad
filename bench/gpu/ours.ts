import { type CausalLM, createModel, deviceStepModel, generateWith, gpt2Config, type GPT2Config, KVCache, microBatchLoss } from '../../src/models/index.ts';
import { AdamW } from '../../src/nn/index.ts';
import { createOrtBackend, loadBackend, noGrad, packedBytes, randint, type Tensor, trace, withBackend } from '../../src/tensor/index.ts';

/**
 * Our side of the GPU bench (bench/gpu/bench.ts): everything runs on the `webgpu` backend
 * (onnxruntime's WebGPU provider), the way `generate --backend webgpu` and `worker --backend
 * webgpu` run it. Each figure is the median of timed repeats after one untimed run that traces
 * and compiles the graphs.
 */

/** Speed of one generation setting: B prompts decoded together, greedy, one token a step. */
export interface DecodeResult {
  batch: number;
  /** Tokens per second over the decoding steps (every row's tokens counted), median of the repeats. */
  tokensPerSecond: number;
  /** Milliseconds per decoding step (all rows), median. */
  stepMs: number;
  /** The prompt's step and the first token, milliseconds, median. */
  promptMs: number;
  /** Seconds the untimed first run took (tracing on the host and compiling the graphs included). */
  firstRunSeconds: number;
  /** Row 0's greedy tokens (to compare with the references'). */
  tokens: number[];
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/**
 * Decode speed through `deviceStepModel(model, 'webgpu')` driven by `generateWith`, as a worker's
 * session on a GPU decodes: a bounded KV cache on the device, each step one graph.
 * @example
 * const r = await oursDecode(model, [[1, 2, 3, 4]], 28, 3)
 */
export async function oursDecode(model: CausalLM, prompts: number[][], newTokens: number, repeats: number): Promise<DecodeResult> {
  const once = async () => {
    const marks: number[] = [];
    const t0 = performance.now();
    const [tokens] = await generateWith(deviceStepModel(model, 'webgpu'), prompts, {
      maxNewTokens: newTokens, temperature: 0, stopTokens: [],
      // row 0's token comes first in each step: its time marks the step
      onToken: (_token, row) => (row === 0 ? marks.push(performance.now()) : undefined),
    });
    const decodeMs = marks[marks.length - 1] - marks[0];
    return { tokens, promptMs: marks[0] - t0, stepMs: decodeMs / (marks.length - 1), total: performance.now() - t0 };
  };
  const first = await once();
  const runs = [];
  for (let i = 0; i < repeats; i++) runs.push(await once());
  const stepMs = median(runs.map((r) => r.stepMs));
  return {
    batch: prompts.length, tokensPerSecond: (1000 * prompts.length) / stepMs, stepMs,
    promptMs: median(runs.map((r) => r.promptMs)), firstRunSeconds: first.total / 1000, tokens: runs[0].tokens,
  };
}

/** Speed of a prompt's pass: `tokens` positions of one sequence into an empty cache. */
export interface PrefillResult {
  tokens: number;
  ms: number;
  tokensPerSecond: number;
  /** Seconds to trace the step on the host and compile it on the device. */
  prepareSeconds: number;
}

/**
 * A prompt's pass of `ids` ([1, T]) on webgpu: the step a DeviceRunner runs for a prompt (the
 * model's forward with an empty cache, its logits and the grown cache as outputs), traced on
 * the host once and run as one graph; timed up to the last position's logits on the host.
 * Traced on onnxruntime's CPU kernels (DeviceRunner traces on js, far too slow for 512 tokens
 * of a 1B model); the graph is the same.
 */
export async function oursPrefill(model: CausalLM, ids: Tensor, repeats: number, traceThreads: number): Promise<PrefillResult> {
  const t0 = performance.now();
  const fn = (x: Tensor): Tensor[] => {
    const cache = new KVCache(model.config.layers);
    const y = model.forward(x, { cache });
    return [y, ...cache.layers.flatMap((e) => (e ? [e.k, e.v] : []))];
  };
  const { step } = withBackend(createOrtBackend({ threads: traceThreads }), () => noGrad(() => trace(fn, [ids])));
  const t = ids.shape[1];
  const once = async () => {
    const input = ids.to('webgpu');
    const start = performance.now();
    const [y, ...kv] = noGrad(() => step.run([input]));
    const last = noGrad(() => y.narrow(1, t - 1, 1));
    await last.toHost();
    const ms = performance.now() - start;
    for (const v of [input, y, last, ...kv]) v.dispose();
    return ms;
  };
  await once();
  const prepareSeconds = (performance.now() - t0) / 1000;
  const times = [];
  for (let i = 0; i < repeats; i++) times.push(await once());
  const ms = median(times);
  return { tokens: t, ms, tokensPerSecond: (1000 * t) / ms, prepareSeconds };
}

/** A training step's time, or why it does not run on webgpu. */
export type TrainResult = { ms: number; loss: number; prepareSeconds: number } | { unsupported: string };

/** A training step of `model` traced whole (forward, cross-entropy, backward, AdamW) with its batch as inputs. */
function tracedTrainStep(model: CausalLM, ids: Tensor, targets: Tensor) {
  const optimizer = new AdamW(model.parameters(), { lr: 1e-4 });
  const count = targets.size;
  const fn = (x: Tensor, y: Tensor): Tensor => {
    model.train();
    const loss = microBatchLoss(model.forward(x), y, count);
    loss.backward();
    optimizer.step();
    optimizer.zeroGrad();
    return loss;
  };
  return (threads: number) => withBackend(createOrtBackend({ threads }), () => trace(fn, [ids, targets]).step);
}

/** Runs a traced training step on webgpu; the error says why it cannot (with the backend's refusal of the graph). */
async function runOnGpu(step: { run(inputs: Tensor[]): Tensor }, ids: Tensor, targets: Tensor): Promise<number> {
  const inputs = [ids.to('webgpu'), targets.to('webgpu')];
  try {
    const loss = step.run(inputs);
    return (await loss.toHost()).data[0];
  } catch (err) {
    const refused = (loadBackend('webgpu') as { steps?: { refused: string[] } }).steps?.refused.at(-1);
    const message = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    throw new Error(refused === undefined ? message : `the step is not one graph there (${refused}); op by op: ${message}`, { cause: err });
  } finally {
    for (const t of inputs) t.dispose();
  }
}

/**
 * A GPT-2 training step (B × T tokens) on webgpu: the step traced whole on the host and run on
 * the device (compileStep). A small GPT-2 is tried first, so a backend that refuses gradients
 * says so at once, without tracing the large one.
 */
export async function oursTrainStep(
  config: GPT2Config, batch: number, seq: number, repeats: number, traceThreads: number,
): Promise<TrainResult> {
  const probe = createModel(gpt2Config({ vocabSize: 64, hidden: 32, layers: 1, heads: 2, maxPositions: 16 }), { seed: 1 });
  const probeIds = randint(0, 64, [1, 8], { seed: 2 });
  try {
    await runOnGpu(tracedTrainStep(probe, probeIds, randint(0, 64, [1, 8], { seed: 3 }))(1), probeIds, randint(0, 64, [1, 8], { seed: 3 }));
  } catch (err) {
    return { unsupported: (err as Error).message };
  }
  const t0 = performance.now();
  const model = createModel(config, { seed: 0 });
  const ids = randint(0, config.vocabSize, [batch, seq], { seed: 4 });
  const targets = randint(0, config.vocabSize, [batch, seq], { seed: 5 });
  const step = tracedTrainStep(model, ids, targets)(traceThreads);
  await runOnGpu(step, ids, targets);
  const prepareSeconds = (performance.now() - t0) / 1000;
  const times: number[] = [];
  let loss = Number.NaN;
  for (let i = 0; i < repeats; i++) {
    const start = performance.now();
    loss = await runOnGpu(step, ids, targets);
    times.push(performance.now() - start);
  }
  return { ms: median(times), loss, prepareSeconds };
}

/**
 * Bytes of weights one decoding step reads: every matrix as held (int4 blocks at their packed
 * size), the norms, and of the token embedding one row per sequence (a lookup, not a product).
 */
export function weightBytesPerToken(model: CausalLM): number {
  let bytes = 0;
  for (const [name, t] of model.hfStateDict()) {
    const held = t.packed ? packedBytes(t.packed) : 4 * t.size;
    // a tied head reads the whole embedding; an untied one's embedding is read a row at a time
    bytes += /embed_tokens|wte/.test(name) && !model.config.tieWordEmbeddings ? held / t.shape[0] : held;
  }
  return bytes;
}
