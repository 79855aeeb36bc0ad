/**
 * One variant of the quant section in its own process, so that its peak resident memory is its own:
 *   node --import tsx bench/quant-child.ts JSON
 * where JSON is a `ChildJob`. Loads the model (ours from a GGUF file at f32, int8 or int4 on the ort backend, or
 * llama.cpp through node-llama-cpp), decodes greedily after the prompt with the KV cache, reads VmHWM, then (if
 * asked) scores held-out windows. Writes one line of JSON (`ChildResult`) to stdout.
 */
import '../src/polyfills.ts';
import { readFileSync } from 'node:fs';
import { heldOutLoss } from '../src/data/index.ts';
import { GraphDecoder } from '../src/models/generation/graph-decode.ts';
import { type CausalLM, KVCache, loadModel } from '../src/models/index.ts';
import { ACCURACY_LEVEL } from '../src/tensor/backends/ort/packed.ts';
import { loadOrtRuntime } from '../src/tensor/backends/ort/runtime.ts';
import { createOrtBackend, encodeModel, noGrad, OnnxType, packedBytes, setBackend, tensor } from '../src/tensor/index.ts';
import { bitsOf, blobBytes, blocksPerRow, QUANT_BLOCK, type QuantFormat } from '../src/tensor/quant/formats.ts';
import { openLlamaCpp, windowLosses } from './llama-cpp-cpu.ts';

export interface ChildJob {
  engine: 'ours' | 'llama.cpp';
  /** The GGUF file (ours loads it too: Q8_0 / Q4_0 blocks are held as int8 / int4 as they are). */
  file: string;
  /** Ours: hold the matrices as int8 / int4 (the file's Q8_0 / Q4_0 blocks as they are). */
  quantize?: 'int8' | 'int4';
  threads: number;
  /** Ours: onnxruntime's spinning pool (absent: the backend's default, 'auto'; the whole-step graph's: off). */
  spinning?: boolean;
  /**
   * Ours: decode with the whole step as one onnxruntime graph (graph-decode.ts: one session, a bounded cache of
   * prompt + tokens slots, the prompt fed a token at a time) instead of op by op.
   */
  wholeStep?: boolean;
  /**
   * Ours: time only the products of a token's step: one graph of a MatMulNBits per int8/int4 matrix of the model
   * (as the whole-step graph has them), run `tokens` − 1 times on a one-row input.
   */
  productsOnly?: boolean;
  prompt: number[];
  /** Tokens to decode after the prompt (the first comes from the prompt's pass). */
  tokens: number;
  /** Times the prompt and decode run (each from an empty cache); speeds are the best round's. */
  rounds: number;
  /** Held-out windows to score after the decode (none: no perplexity). */
  heldOut?: { data: number[]; seqLen: number; windows: number };
  /** node-llama-cpp's entry module (llama.cpp only). */
  llamaModule?: string;
}

export interface ChildResult {
  /** Greedy tokens after the prompt. */
  tokens: number[];
  /** Decode speed over the tokens after the first (one token a step, KV cache), best round. */
  tokensPerSecond: number;
  /**
   * CPU time of the whole process (all its threads) per decoded token, least of the rounds: less swayed than the
   * speed by other work on a shared machine (a spinning pool's waiting counts).
   */
  cpuMsPerToken: number;
  /** Prompt pass and first token, best round. */
  promptSeconds: number;
  /** VmHWM after the decode, in bytes. */
  peakRss: number;
  /** Resident memory after load, before the decode. */
  loadedRss: number;
  /** Bytes of the weights as held (ours only). */
  weightBytes?: number;
  heldOut?: { loss: number; perplexity: number; tokens: number };
  /** productsOnly: how many MatMulNBits the graph has. */
  products?: number;
  /** The whole-step graph's decode steps: ms per step inside onnxruntime's run and in the js around it; compile s. */
  profile?: { runMs: number; glueMs: number; compileSeconds: number };
}

/** CPU time of this process so far (user + system, all threads), in ms. */
const cpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

function status(field: 'VmHWM' | 'VmRSS'): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) * 1024 : Number.NaN;
}

/** The bytes the weights take as held: compact matrices at their packed size, the rest in float32. */
function heldBytes(model: CausalLM): number {
  let bytes = 0;
  for (const [, t] of model.hfStateDict()) bytes += t.packed ? packedBytes(t.packed) : 4 * t.size;
  return bytes;
}

const argmax = (v: Float32Array) => {
  let best = 0;
  for (let i = 1; i < v.length; i++) if (v[i] > v[best]) best = i;
  return best;
};

/** Ours with the whole step as one onnxruntime graph (GraphDecoder); the speeds and profile are the best round's. */
function wholeStep(job: ChildJob, model: CausalLM, loadedRss: number): ChildResult {
  const capacity = job.prompt.length + job.tokens;
  const decoder = new GraphDecoder(model, { capacity, threads: job.threads, spinning: job.spinning ?? false });
  let tokens: number[] = [];
  let promptSeconds = Infinity;
  let decodeSeconds = Infinity;
  let profile = { runMs: 0, glueMs: 0 };
  let cpuPerToken = Infinity;
  for (let round = 0; round < job.rounds; round++) {
    decoder.reset();
    let t = performance.now();
    let logits: Float32Array = new Float32Array();
    for (const id of job.prompt) logits = decoder.step(id);
    tokens = [argmax(logits)];
    promptSeconds = Math.min(promptSeconds, (performance.now() - t) / 1000);
    const { runMs, glueMs, steps } = decoder.profile;
    t = performance.now();
    const cpu = cpuMs();
    while (tokens.length < job.tokens) tokens.push(argmax(decoder.step(tokens[tokens.length - 1])));
    const seconds = (performance.now() - t) / 1000;
    cpuPerToken = Math.min(cpuPerToken, (cpuMs() - cpu) / (job.tokens - 1));
    if (seconds < decodeSeconds) {
      const n = decoder.profile.steps - steps;
      decodeSeconds = seconds;
      profile = { runMs: (decoder.profile.runMs - runMs) / n, glueMs: (decoder.profile.glueMs - glueMs) / n };
    }
  }
  return {
    tokens, tokensPerSecond: (job.tokens - 1) / decodeSeconds, cpuMsPerToken: cpuPerToken, promptSeconds, peakRss: status('VmHWM'), loadedRss,
    weightBytes: heldBytes(model), profile: { ...profile, compileSeconds: decoder.profile.compileMs / 1000 },
  };
}

/** The model's int8/int4 products alone, as one graph of MatMulNBits nodes (see ChildJob.productsOnly). */
function productsOnly(job: ChildJob, model: CausalLM, loadedRss: number): ChildResult {
  const mats = [...model.hfStateDict().values()].flatMap((t) => (t.packed && t.packed.format !== 'bf16' ? [t.packed] : []));
  const widths = [...new Set(mats.map((p) => p.cols))];
  const nodes = mats.map((p, i) => ({
    op: 'MatMulNBits', domain: 'com.microsoft', inputs: [`a${p.cols}`, `b${i}`, `s${i}`], outputs: [`y${i}`],
    attributes: { K: p.cols, N: p.rows, bits: bitsOf(p.format as QuantFormat), block_size: QUANT_BLOCK, accuracy_level: ACCURACY_LEVEL },
  }));
  const initializers = mats.flatMap((p, i) => [
    { name: `b${i}`, dims: [p.rows, blocksPerRow(p.cols), blobBytes(p.format as QuantFormat)], data: p.data as Uint8Array },
    { name: `s${i}`, dims: [p.rows * blocksPerRow(p.cols)], data: p.scales },
  ]);
  const graph = encodeModel(
    nodes,
    widths.map((k) => ({ name: `a${k}`, type: OnnxType.float32, shape: [1, k] })),
    mats.map((p, i) => ({ name: `y${i}`, type: OnnxType.float32, shape: [1, p.rows] })),
    17,
    { initializers, opsets: { 'com.microsoft': 1 } },
  );
  const session = loadOrtRuntime('ffi').session(graph, job.threads, job.spinning ?? false);
  const inputs = widths.map((k) => ({ name: `a${k}`, data: new Float32Array(k).fill(0.01), dims: [1, k] }));
  const outputs = mats.map((p, i) => ({ name: `y${i}`, data: new Float32Array(p.rows), dims: [1, p.rows] }));
  const runs = job.tokens - 1;
  let seconds = Infinity;
  let cpuPerToken = Infinity;
  for (let round = 0; round < job.rounds; round++) {
    const t = performance.now();
    const cpu = cpuMs();
    for (let i = 0; i < runs; i++) session.run(inputs, outputs);
    seconds = Math.min(seconds, (performance.now() - t) / 1000);
    cpuPerToken = Math.min(cpuPerToken, (cpuMs() - cpu) / runs);
  }
  return {
    tokens: [], tokensPerSecond: runs / seconds, cpuMsPerToken: cpuPerToken, promptSeconds: 0, peakRss: status('VmHWM'), loadedRss,
    weightBytes: heldBytes(model), products: mats.length,
  };
}

async function ours(job: ChildJob): Promise<ChildResult> {
  setBackend(createOrtBackend({ threads: job.threads, ...(job.spinning !== undefined ? { spinning: job.spinning } : {}) }));
  const model = await loadModel(job.file, job.quantize ? { quantize: job.quantize } : {});
  const loadedRss = status('VmRSS');
  if (job.wholeStep) return wholeStep(job, model, loadedRss);
  if (job.productsOnly) return productsOnly(job, model, loadedRss);
  let tokens: number[] = [];
  let promptSeconds = Infinity;
  let decodeSeconds = Infinity;
  let cpuPerToken = Infinity;
  for (let round = 0; round < job.rounds; round++) {
    const cache = new KVCache(model.config.layers);
    const next = (ids: number[]) =>
      noGrad(() => {
        const logits = model.forward(tensor(Int32Array.from(ids), [1, ids.length], 'int32'), { cache });
        const v = logits.shape[2];
        return argmax(logits.data.subarray((ids.length - 1) * v, ids.length * v) as Float32Array);
      });
    let t = performance.now();
    tokens = [next(job.prompt)];
    promptSeconds = Math.min(promptSeconds, (performance.now() - t) / 1000);
    t = performance.now();
    const cpu = cpuMs();
    while (tokens.length < job.tokens) tokens.push(next([tokens[tokens.length - 1]]));
    decodeSeconds = Math.min(decodeSeconds, (performance.now() - t) / 1000);
    cpuPerToken = Math.min(cpuPerToken, (cpuMs() - cpu) / (job.tokens - 1));
  }
  const result: ChildResult = {
    tokens, tokensPerSecond: (job.tokens - 1) / decodeSeconds, cpuMsPerToken: cpuPerToken, promptSeconds, peakRss: status('VmHWM'), loadedRss,
    weightBytes: heldBytes(model),
  };
  if (job.heldOut) {
    const { data, seqLen, windows } = job.heldOut;
    result.heldOut = await heldOutLoss((ids) => model.forward(ids), Int32Array.from(data), { seqLen, batchSize: 4, windows });
  }
  return result;
}

async function llamaCpp(job: ChildJob): Promise<ChildResult> {
  const seqLen = job.heldOut?.seqLen ?? 0;
  const sequence = await openLlamaCpp(job.llamaModule!, job.file, job.threads, seqLen);
  const loadedRss = status('VmRSS');
  let tokens: number[] = [];
  let promptSeconds = Infinity;
  let decodeSeconds = Infinity;
  let cpuPerToken = Infinity;
  for (let round = 0; round < job.rounds; round++) {
    await sequence.clearHistory();
    tokens = [];
    let t = performance.now();
    let cpu = cpuMs();
    for await (const token of sequence.evaluate(job.prompt, { temperature: 0 })) {
      tokens.push(Number(token));
      if (tokens.length === 1) {
        promptSeconds = Math.min(promptSeconds, (performance.now() - t) / 1000);
        t = performance.now();
        cpu = cpuMs();
      }
      if (tokens.length >= job.tokens) break;
    }
    decodeSeconds = Math.min(decodeSeconds, (performance.now() - t) / 1000);
    cpuPerToken = Math.min(cpuPerToken, (cpuMs() - cpu) / (job.tokens - 1));
  }
  const result: ChildResult = {
    tokens, tokensPerSecond: (job.tokens - 1) / decodeSeconds, cpuMsPerToken: cpuPerToken, promptSeconds, peakRss: status('VmHWM'), loadedRss,
  };
  if (job.heldOut) {
    // each window from an empty cache, as ours: −log p(target) from llama.cpp's full next-token distribution
    const { data, windows } = job.heldOut;
    const losses = await windowLosses(sequence, data, seqLen, windows);
    const available = losses.length;
    const total = losses.reduce((sum, x) => sum + x, 0);
    const count = available * seqLen;
    result.heldOut = { loss: total / count, perplexity: Math.exp(total / count), tokens: count };
  }
  return result;
}

const job = JSON.parse(process.argv[2]) as ChildJob;
const result = job.engine === 'ours' ? await ours(job) : await llamaCpp(job);
process.stdout.write(`${JSON.stringify(result)}\n`);
process.exit(0);
