/**
 * One engine and format of the perplexity section in its own process (webgpu needs SwiftShader's variables set before
 * the process starts; each variant's memory is its own):
 *   node --import tsx bench/perplexity-child.ts JSON
 * where JSON is a `PerplexityJob`. Scores the held-out fortunes (fortunesDataset's split, byte-level tokens) in windows
 * of `seqLen` from the start, each window from an empty cache: the first `slice` windows, and (if asked) every window
 * the held-out text holds. Ours loads the GGUF file in the format asked (the file's BF16 / Q8_0 / Q4_0 tensors held as
 * bf16 / int8 / int4 as they are) and runs on the js or ort backend (model.forward) or on webgpu (DeviceRunner: the
 * forward traced once on js and run as one graph); llama.cpp (node-llama-cpp) runs the same file and gives its full
 * next-token distribution (softmax of the raw logits: temperature 0 samples greedily, which leaves the candidates
 * whole). Writes one line of JSON (`PerplexityResult`) to stdout.
 */
import '../src/polyfills.ts';
import { fortunesDataset, type HeldOutLoss, heldOutLoss } from '../src/data/index.ts';
import { byteLevelTokenizerJson, DeviceRunner, HFTokenizer, loadModel } from '../src/models/index.ts';
import { createOrtBackend, jsBackend, setBackend, type Tensor } from '../src/tensor/index.ts';
import { openLlamaCpp, windowLosses } from './llama-cpp-cpu.ts';

export type Engine = 'js' | 'ort' | 'webgpu' | 'llama.cpp';

export interface PerplexityJob {
  engine: Engine;
  /** The GGUF file. */
  file: string;
  /** Ours: the format the matrices are held in (f32: as the file has them, which is F32). */
  format: 'f32' | 'bf16' | 'int8' | 'int4';
  seqLen: number;
  /** Windows of the slice every engine scores (webgpu only this). */
  slice: number;
  /** Also score every window of the held-out text. */
  full: boolean;
  /** CPU threads (ort, llama.cpp). */
  threads: number;
  /** node-llama-cpp's entry module (llama.cpp only). */
  llamaModule?: string;
}

export interface PerplexityResult {
  slice: HeldOutLoss;
  full?: HeldOutLoss;
  /** Seconds the scoring took (both sets; the load not counted). */
  seconds: number;
}

/** Windows scored at a time by ours (the webgpu graph is made for this batch: the slice is a multiple of it). */
export const BATCH = 4;

async function ours(job: PerplexityJob, data: Int32Array): Promise<PerplexityResult> {
  if (job.engine === 'ort') setBackend(createOrtBackend({ threads: job.threads }));
  else setBackend(jsBackend);
  const model = await loadModel(job.file, job.format === 'f32' ? {} : job.format === 'bf16' ? { dtype: 'bf16' } : { quantize: job.format });
  let logitsOf: (ids: Tensor) => Promise<Tensor> | Tensor = (ids) => model.forward(ids);
  if (job.engine === 'webgpu') {
    const runner = new DeviceRunner(model, 'webgpu');
    logitsOf = (ids) => {
      runner.reset();
      return runner.step(ids);
    };
  }
  const started = performance.now();
  const score = (windows = Number.MAX_SAFE_INTEGER) => heldOutLoss(logitsOf, data, { seqLen: job.seqLen, batchSize: BATCH, windows });
  const slice = await score(job.slice);
  const full = job.full ? await score() : undefined;
  return { slice, ...(full ? { full } : {}), seconds: (performance.now() - started) / 1000 };
}

async function llamaCpp(job: PerplexityJob, data: Int32Array): Promise<PerplexityResult> {
  const { seqLen } = job;
  const sequence = await openLlamaCpp(job.llamaModule!, job.file, job.threads, seqLen);
  const available = Math.floor((data.length - 1) / seqLen);
  // −log p(target) of every window, from an empty cache each, as ours
  const started = performance.now();
  const losses = await windowLosses(sequence, data, seqLen, job.full ? available : Math.min(job.slice, available));
  const over = (n: number): HeldOutLoss => {
    const loss = losses.slice(0, n).reduce((s, x) => s + x, 0) / (n * seqLen);
    return { loss, perplexity: Math.exp(loss), tokens: n * seqLen };
  };
  const seconds = (performance.now() - started) / 1000;
  return { slice: over(Math.min(job.slice, available)), ...(job.full ? { full: over(available) } : {}), seconds };
}

const job = JSON.parse(process.argv[2]) as PerplexityJob;
const data = fortunesDataset(new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>)).heldOut;
const result = job.engine === 'llama.cpp' ? await llamaCpp(job, data) : await ours(job, data);
process.stdout.write(`${JSON.stringify(result)}\n`);
process.exit(0);
