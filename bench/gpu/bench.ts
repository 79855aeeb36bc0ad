/**
 * The GPU bench of #46, in one run (bench/gpu/run.sh starts it; README.md beside it says how it
 * gets to a GPU machine). On the GPU the webgpu backend (onnxruntime's WebGPU provider) is given:
 * - decode tokens/s of a Llama-shaped model of 1.1B parameters (TinyLlama's shape, random weights
 *   made here, seeded) at int4 and f32, batch 1 and 16, against transformers + PyTorch (bf16, CUDA)
 *   on the same safetensors and llama.cpp (node-llama-cpp, Vulkan) on the same model in GGUF Q4_0;
 * - a prompt's pass of 512 tokens, against the same two;
 * - a GPT-2 124M training step (4 × 512 tokens) against PyTorch (float32) on the same GPU;
 * - the memory bandwidth batch-1 int4 decoding achieves (weight bytes per token × tokens/s) as a
 *   fraction of the GPU's datasheet bandwidth and of the copy bandwidth PyTorch measures.
 * Budget: 10 minutes on an H100 or H200 for the whole of run.sh; this program starts no section
 * that would end past --budget seconds (default 480; the estimates are rough) and says which it
 * skipped. Order: the model files (~1 min, estimated from a 2-core VM), batch 1, prefill, training,
 * the references (150 s kept for them), then batch 16, whose host-side traces of the 1.1B model
 * (js kernels, ~1.5 min a graph at int4 by that estimate) make it the part most likely skipped.
 * Not yet run on a GPU: the timings are estimates.
 * With --allow-software (SwiftShader, no GPU) every shape is tiny: it shows the script works, its
 * figures say nothing about a GPU.
 *
 * --only ours,llama,torch runs those parts alone and takes the others' figures from the last run's
 * results.json in TL_WORK (with its model files): a second call on the same machine, when the
 * first could not carry everything (README.md).
 *
 * usage: node --import tsx bench/gpu/bench.ts [--allow-software] [--size 1b|tiny] [--budget S] [--out DIR] [--only PARTS]
 */
import '../../src/polyfills.ts';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { gpt2Config, llamaConfig } from '../../src/models/index.ts';
import { createOrtBackend, randint, setBackend } from '../../src/tensor/index.ts';
import { benchModels } from './model.ts';
import { oursDecode, oursPrefill, oursTrainStep, weightBytesPerToken } from './ours.ts';
import { llamaModule, nvidiaSmi, peakBandwidth, runLlama, runTorch, torchDevice, webgpuAdapter } from './refs.ts';
import { printReport, type Results } from './report.ts';

const { values } = parseArgs({
  options: {
    'allow-software': { type: 'boolean', default: false },
    'size': { type: 'string' },
    'budget': { type: 'string', default: '480' },
    'out': { type: 'string' },
    'only': { type: 'string', default: 'ours,llama,torch' },
  },
});
const software = values['allow-software'];
const size = values.size ?? (software ? 'tiny' : '1b');
if (size !== '1b' && size !== 'tiny') throw new Error(`--size is 1b or tiny, not ${size}`);
const started = performance.now();
const budget = Number(values.budget);
const elapsed = () => (performance.now() - started) / 1000;
const log = (s: string) => process.stderr.write(`[${elapsed().toFixed(0).padStart(4)} s] ${s}\n`);
const threads = Math.max(1, Math.min(16, availableParallelism()));

/** The shapes: TinyLlama 1.1B's and GPT-2 124M's on a GPU; tiny ones for a software adapter. */
const SHAPES = {
  '1b': {
    llama: { vocabSize: 32000, hidden: 2048, layers: 22, heads: 32, kvHeads: 4, intermediate: 5632, maxPositions: 2048 },
    gpt2: {}, train: [4, 512], prefill: 512, repeats: 3,
  },
  'tiny': {
    llama: { vocabSize: 512, hidden: 64, layers: 2, heads: 4, kvHeads: 2, intermediate: 128, maxPositions: 1024 },
    gpt2: { vocabSize: 512, hidden: 64, layers: 2, heads: 4, maxPositions: 128 }, train: [2, 64], prefill: 512, repeats: 2,
  },
} as const;
const shape = SHAPES[size];
/**
 * Decoding: a 4-token prompt (1 token for each of the 16 rows of a batch) and 28 new tokens: positions 4-31, one bounded
 * cache of 32 slots (one decoding graph).
 */
const PROMPT = 4;
const BATCH = 16;
const NEW_TOKENS = 28;
/** Seconds kept for the references after our sections. */
const REFS_RESERVE = size === '1b' ? 150 : 60;

const only = new Set(values.only.split(','));
const work = process.env.TL_WORK ?? join(tmpdir(), 'tensorlink-gpu-bench');
const saved = join(work, 'results.json');
/** The last run's results, where only some parts run now: their figures stand for the parts not run. */
const previous = only.size < 3 && existsSync(saved) ? (JSON.parse(readFileSync(saved, 'utf8')) as Results) : null;
if (previous && previous.size !== size) throw new Error(`${saved} holds a run at size ${previous.size}, not ${size}`);
const results: Results = { ...previous, size, software, budget, skipped: [], notes: [] };
const skip = (what: string, why: string) => {
  results.skipped.push(`${what}: ${why}`);
  log(`skipped ${what}: ${why}`);
};
/** Runs a section if the budget allows `estimate` more seconds (plus the references' reserve); records its error otherwise. */
async function section<T>(what: string, estimate: number, fn: () => Promise<T>, reserve = REFS_RESERVE): Promise<T | null> {
  if (elapsed() + estimate + reserve > budget) {
    skip(what, `the run's budget of ${budget} s would be passed (${elapsed().toFixed(0)} s spent, ~${estimate} s needed)`);
    return null;
  }
  log(`${what} ...`);
  try {
    return await fn();
  } catch (err) {
    skip(what, `failed: ${(err as Error).message.split('\n')[0]}`);
    return null;
  }
}

// the adapter first: a software one is refused unless asked for
setBackend(createOrtBackend({ threads }));
const adapter = await webgpuAdapter();
results.adapter = adapter;
log(`webgpu adapter: ${adapter.kind} (Vulkan drivers loaded: ${adapter.drivers.join(', ') || 'none found'}); nvidia-smi: ${adapter.gpu ?? 'not here'}`);
if (adapter.kind !== 'nvidia' && !software) {
  log(`the webgpu backend is not on an NVIDIA GPU (${adapter.kind}); run.sh points Vulkan at NVIDIA's driver, or pass --allow-software to run anyway`);
  process.exit(2);
}
const peak = peakBandwidth(adapter.gpu ?? nvidiaSmi());

// the model files, made here by the project's own code (seeded random weights, never downloaded)
mkdirSync(work, { recursive: true });
const config = llamaConfig({ ...shape.llama, tieWordEmbeddings: false, bosTokenId: 256, eosTokenId: 256 });
const reuse = !only.has('ours') && previous?.model !== undefined && existsSync(join(work, 'model-q4_0.gguf'));
const made = reuse ? null : await benchModels(config, work, 0, log);
const hfDir = join(work, 'hf');
const gguf = join(work, 'model-q4_0.gguf');
if (made) {
  results.model = {
    shape: shape.llama, parameters: made.f32.numParameters(), seconds: elapsed(),
    int4BytesPerToken: weightBytesPerToken(made.int4), f32BytesPerToken: weightBytesPerToken(made.f32),
  };
}
const m = results.model!;
log(`model${reuse ? ' (the last run\'s files)' : ''}: ${(m.parameters / 1e6).toFixed(1)}M parameters; weights read per token: int4 ${(m.int4BytesPerToken / 1e6).toFixed(1)} MB, f32 ${(m.f32BytesPerToken / 1e6).toFixed(1)} MB`);

const one = [Array.from(randint(0, 256, [PROMPT], { seed: 1 }).data)];
const many = Array.from({ length: BATCH }, (_, i) => [Array.from(randint(0, 256, [1], { seed: 10 + i }).data)[0]]);
const prefillIds = randint(0, 256, [1, shape.prefill], { seed: 2 });
const prefill = Array.from(prefillIds.data);
const big = size === '1b';
results.notes.push('f16: not measured: the webgpu backend computes and stores in float32 (f16 storage and compute are not implemented yet)');

const [tb, tt] = shape.train;
const gpt2 = gpt2Config(shape.gpt2);
if (made) {
  const { int4, f32 } = made;
  results.ours = {};
  const o = results.ours;
  o.decodeInt4B1 = await section('ours: decode int4, batch 1', big ? 40 : 10, () => oursDecode(int4, one, NEW_TOKENS, shape.repeats));
  o.decodeF32B1 = await section('ours: decode f32, batch 1', big ? 40 : 10, () => oursDecode(f32, one, NEW_TOKENS, shape.repeats));
  o.prefillInt4 = await section(`ours: prefill ${shape.prefill} int4`, big ? 40 : 10, () => oursPrefill(int4, prefillIds, shape.repeats, threads));
  o.prefillF32 = await section(`ours: prefill ${shape.prefill} f32`, big ? 40 : 10, () => oursPrefill(f32, prefillIds, shape.repeats, threads));
  o.train = await section(`ours: GPT-2 training step ${tb}×${tt}`, big ? 60 : 10, () => oursTrainStep(gpt2, tb, tt, shape.repeats, threads));
}

results.references ??= {};
const llama = llamaModule();
if (!only.has('llama')) log('llama.cpp: not run now (--only)');
else if ('skip' in llama) skip('llama.cpp', llama.skip);
else if (!llama.builds.includes('vulkan') && !llama.builds.includes('cuda')) {
  skip('llama.cpp', 'neither @node-llama-cpp/linux-x64-vulkan nor -cuda is installed beside node-llama-cpp');
} else {
  // Vulkan (the API our backend runs on) where it is there, also on a software adapter: the GPU run's code path
  const gpu = llama.builds.includes('vulkan') ? 'vulkan' : 'cuda';
  results.references.llama = await section(`llama.cpp Q4_0 (${gpu})`, big ? 60 : 20, () => runLlama({
    module: llama.module, file: gguf, gpu, batches: [one, many], newTokens: NEW_TOKENS, repeats: software ? 1 : shape.repeats, prefill,
    threads: software ? 2 : threads,
  }), 0);
  const seen = results.references.llama;
  if (seen && !software && !seen.devices.some((d) => /nvidia/i.test(d))) {
    results.notes.push(`llama.cpp saw no NVIDIA GPU (devices: ${seen.devices.join(', ') || 'none'}): its figures are not the GPU's`);
  }
}
const torch = torchDevice(software);
if (!only.has('torch')) log('transformers + PyTorch: not run now (--only)');
else if ('skip' in torch) skip('transformers + PyTorch', torch.skip);
else {
  results.references.torch = await section(`transformers + PyTorch bf16 (${torch.device})`, big ? 60 : 20, () => runTorch({
    model_dir: hfDir, device: torch.device, batches: [one, many], new_tokens: NEW_TOKENS, repeats: shape.repeats, prefill,
    gpt2: {
      batch: tb, seq: tt, vocab: gpt2.vocabSize, hidden: gpt2.hidden, layers: gpt2.layers, heads: gpt2.heads, positions: gpt2.maxPositions,
    },
    threads: software ? 2 : threads,
  }), 0);
}

// batch 16 last: its traces on the host (js) are the slowest part (~1.5 min a graph for the 1.1B model at int4)
if (made) {
  const { int4, f32 } = made;
  const o = results.ours!;
  o.decodeInt4B16 = await section(`ours: decode int4, batch ${BATCH}`, big ? 150 : 15, () => oursDecode(int4, many, NEW_TOKENS, shape.repeats), 0);
  o.decodeF32B16 = await section(`ours: decode f32, batch ${BATCH}`, big ? 150 : 15, () => oursDecode(f32, many, NEW_TOKENS, shape.repeats), 0);
}

results.seconds = elapsed();
results.peakBytesPerSecond = peak;
const out = values.out ?? process.env.OUT ?? join('bench', 'out', 'gpu');
mkdirSync(out, { recursive: true });
writeFileSync(join(out, 'gpu-bench.json'), `${JSON.stringify(results, null, 2)}\n`);
writeFileSync(saved, `${JSON.stringify(results, null, 2)}\n`);
printReport(results, log);
log(`JSON: ${join(out, 'gpu-bench.json')}`);
process.exit(0);
