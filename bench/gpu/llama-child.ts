/**
 * llama.cpp's side of the GPU bench, in its own process (node-llama-cpp's GPU build on the same GPU):
 *   node --import tsx bench/gpu/llama-child.ts JSON      (or llama-child.mjs, bundled by pack.sh)
 * where JSON is a LlamaJob. Loads the GGUF file with every layer on the GPU, decodes greedily after
 * each prompt (all prompts of a batch as parallel sequences of one context), then times a prompt's
 * pass of `prefill` tokens. Writes one line of JSON (LlamaResult) to stdout.
 */

export interface LlamaJob {
  /** node-llama-cpp's entry module (dist/index.js). */
  module: string;
  file: string;
  /** 'vulkan' or 'cuda' on the GPU; false for the CPU (a software run's fallback). */
  gpu: 'vulkan' | 'cuda' | false;
  /** Batches to decode: each a list of prompts (token ids). */
  batches: number[][][];
  newTokens: number;
  repeats: number;
  /** Prompt ids of the prefill measure ([] for none). */
  prefill: number[];
  threads: number;
}

export interface LlamaDecode {
  batch: number;
  tokensPerSecond: number;
  stepMs: number;
  tokens: number[];
}

export interface LlamaResult {
  gpu: string | false;
  devices: string[];
  gpuLayers: number;
  decode: LlamaDecode[];
  prefill: { tokens: number; ms: number; tokensPerSecond: number } | null;
  errors: string[];
}

interface Sequence {
  evaluate(tokens: number[], options: { temperature: number }): AsyncGenerator<number>;
  evaluateWithoutGeneratingNewTokens(tokens: number[]): Promise<void>;
  clearHistory(): Promise<void>;
}
interface Context {
  getSequence(): Sequence;
  dispose(): Promise<void>;
}
interface Model {
  readonly gpuLayers: number;
  createContext(o: object): Promise<Context>;
}
interface Llama {
  readonly gpu: string | false;
  getGpuDeviceNames(): Promise<string[]>;
  loadModel(o: object): Promise<Model>;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** One decoding run of a batch: each prompt a sequence, all evaluated together; step times from row 0's tokens. */
async function decodeOnce(sequences: Sequence[], prompts: number[][], newTokens: number): Promise<{ stepMs: number; tokens: number[] }> {
  await Promise.all(sequences.map((s) => s.clearHistory()));
  const marks: number[] = [];
  const rows = await Promise.all(prompts.map(async (prompt, row) => {
    const tokens: number[] = [];
    for await (const token of sequences[row].evaluate(prompt, { temperature: 0 })) {
      tokens.push(Number(token));
      if (row === 0) marks.push(performance.now());
      if (tokens.length >= newTokens) break;
    }
    return tokens;
  }));
  return { stepMs: (marks[marks.length - 1] - marks[0]) / (marks.length - 1), tokens: rows[0] };
}

async function main(job: LlamaJob): Promise<LlamaResult> {
  const { getLlama } = (await import(job.module)) as { getLlama(o: object): Promise<Llama> };
  const llama = await getLlama({ gpu: job.gpu, build: 'never', logLevel: 'error', maxThreads: job.threads });
  const model = await llama.loadModel({ modelPath: job.file, gpuLayers: job.gpu === false ? 0 : 'max' });
  const result: LlamaResult = {
    gpu: llama.gpu, devices: job.gpu === false ? [] : await llama.getGpuDeviceNames(), gpuLayers: model.gpuLayers,
    decode: [], prefill: null, errors: [],
  };
  for (const prompts of job.batches) {
    try {
      const longest = Math.max(...prompts.map((p) => p.length));
      const context = await model.createContext({
        sequences: prompts.length, contextSize: prompts.length * (longest + job.newTokens + 8),
        batchSize: Math.max(512, prompts.length * longest),
        threads: { ideal: job.threads, min: 1 },
      });
      const sequences = prompts.map(() => context.getSequence());
      await decodeOnce(sequences, prompts, job.newTokens);
      const runs = [];
      for (let i = 0; i < job.repeats; i++) runs.push(await decodeOnce(sequences, prompts, job.newTokens));
      const stepMs = median(runs.map((r) => r.stepMs));
      result.decode.push({ batch: prompts.length, stepMs, tokensPerSecond: (1000 * prompts.length) / stepMs, tokens: runs[0].tokens });
      await context.dispose();
    } catch (err) {
      result.errors.push(`batch ${prompts.length}: ${(err as Error).message}`);
    }
  }
  if (job.prefill.length > 0) {
    try {
      const context = await model.createContext({
        contextSize: job.prefill.length + 16, batchSize: job.prefill.length, threads: { ideal: job.threads, min: 1 },
      });
      const sequence = context.getSequence();
      const times: number[] = [];
      for (let i = 0; i <= job.repeats; i++) {
        await sequence.clearHistory();
        const start = performance.now();
        await sequence.evaluateWithoutGeneratingNewTokens(job.prefill);
        if (i > 0) times.push(performance.now() - start);
      }
      const ms = median(times);
      result.prefill = { tokens: job.prefill.length, ms, tokensPerSecond: (1000 * job.prefill.length) / ms };
      await context.dispose();
    } catch (err) {
      result.errors.push(`prefill: ${(err as Error).message}`);
    }
  }
  return result;
}

const job = JSON.parse(process.argv[2]) as LlamaJob;
process.stdout.write(`${JSON.stringify(await main(job))}\n`);
process.exit(0);
