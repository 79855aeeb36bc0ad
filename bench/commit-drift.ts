import { argv } from 'node:process';
import { type CausalLM, createModel, type LlamaConfig, llamaConfig } from '../src/models/index.ts';
import { sectionCopy } from '../src/pipeline/index.ts';
import {
  type Backend, createOrtBackend, Generator, jsBackend, loadBackend, noGrad, packWeight, randn, type Tensor, trace, type WeightFormat,
  withBackend,
} from '../src/tensor/index.ts';
import { type ChunkCheck, checkChunk, COMMIT_CHUNK, commitChunk } from '../src/verify/records/commit.ts';

/**
 * What activation commitments (src/verify/records/commit.ts, TOPLOC's encoding) see: #47's calibration, a first pass.
 * A section of 2 Llama blocks computes 32 positions of hidden states; the worker commits to the chunk (its output, or
 * what the section added: output − input) and a validator recomputes it on js in float32 and checks the commitment.
 * Rows: honest workers on other backends (ort at 1 and 2 threads, webgpu where an adapter is at hand) and cheats
 * (noise of relative size ν on the output, the input returned (skip), zeros, the matrices held in int8 or int4 where f32
 * is announced, another model of the same shape). Each cell: exponent mismatches of 128, mean / median |Δmantissa|, the
 * worst over the chunks of SEEDS inputs. Thresholds are not set here; this shows where honest drift and cheats lie.
 *
 * Run: node --import tsx bench/commit-drift.ts [--hidden N] (VK_ICD_FILENAMES and LD_LIBRARY_PATH for SwiftShader)
 */

const hiddenArg = argv.indexOf('--hidden');
const HIDDEN = hiddenArg > 0 ? Number(argv[hiddenArg + 1]) : 256;
const SEEDS = 4;
const config: LlamaConfig = llamaConfig({
  vocabSize: 512, hidden: HIDDEN, layers: 2, heads: 8, kvHeads: 4, intermediate: Math.round((HIDDEN * 8) / 3), maxPositions: 256,
});

/** The blocks of a seeded Llama (layers [1, L + 1)), matrices held in `format` where given. */
function section(seed: number, format?: WeightFormat): CausalLM {
  const part = sectionCopy(createModel(config, { seed }), [1, config.layers + 1]);
  if (format) for (const [, t] of part.hfStateDict()) if (t.ndim === 2) packWeight(t, format);
  return part;
}

type Worker = (x: Tensor) => Float32Array;

const on = (backend: Backend, model: CausalLM): Worker => (x) =>
  withBackend(backend, () => noGrad(() => model.forward(x).data as Float32Array));

function noisy(nu: number, honest: Worker): Worker {
  const rng = new Generator(9);
  return (x) => {
    const y = honest(x);
    let norm = 0;
    for (const v of y) norm += v * v;
    const scale = (nu * Math.sqrt(norm)) / Math.sqrt(y.length);
    return y.map((v) => v + scale * rng.normal());
  };
}

/** The section as a GPU worker runs it: its forward traced on the host and compiled as one graph on webgpu; null without an adapter. */
function onWebgpu(model: CausalLM): Worker | null {
  let backend: Backend;
  try {
    backend = loadBackend('webgpu');
  } catch {
    return null;
  }
  return (x) => {
    const { step } = noGrad(() => trace((v: Tensor) => model.forward(v), [x]));
    const compiled = backend.compileStep?.(step);
    if (!compiled) throw new Error('the section did not compile on webgpu');
    const [y] = compiled.run([x.to('webgpu')]);
    const out = new Float32Array(y.size);
    backend.allocator!.copyoutSync!(y.deviceStorage!.handle, out);
    y.dispose();
    return out;
  };
}

/** The worst (largest) of each figure over the checks. */
const worst = (checks: ChunkCheck[]): ChunkCheck => ({
  expMismatches: Math.max(...checks.map((c) => c.expMismatches)),
  mantMean: Math.max(...checks.map((c) => c.mantMean)),
  mantMedian: Math.max(...checks.map((c) => c.mantMedian)),
});

const reference = section(1);
const validator = on(jsBackend, reference);
const workers: [string, Worker | null][] = [
  ['honest: ort, 1 thread', on(createOrtBackend({ threads: 1, minMacs: 0, minElements: 0 }), reference)],
  ['honest: ort, 2 threads', on(createOrtBackend({ threads: 2, minMacs: 0, minElements: 0 }), reference)],
  ['honest: js again', validator],
  ['honest: webgpu (one graph)', onWebgpu(reference)],
  ['cheat: noise 1e-4', noisy(1e-4, validator)],
  ['cheat: noise 1e-3', noisy(1e-3, validator)],
  ['cheat: skip (returns its input)', (x) => x.data as Float32Array],
  ['cheat: zeros', (x) => new Float32Array(x.size)],
  ['cheat: int8 computed, f32 announced', on(jsBackend, section(1, 'int8'))],
  ['cheat: int4 computed, f32 announced', on(jsBackend, section(1, 'int4'))],
  ['cheat: another model (seed 2)', on(jsBackend, section(2))],
];

const inputs = Array.from({ length: SEEDS }, (_, s) => randn([1, COMMIT_CHUNK, HIDDEN], { seed: 100 + s }));
const fmt = (c: ChunkCheck) => `${String(c.expMismatches).padStart(3)} / ${c.mantMean.toFixed(2).padStart(5)} / ${String(c.mantMedian).padStart(3)}`;
console.log(`Llama section, 2 blocks, hidden ${HIDDEN}, ${COMMIT_CHUNK} positions; worst over ${SEEDS} inputs: exponent mismatches of 128 / mean / median |Δmantissa|`);
console.log(`${'worker'.padEnd(40)} ${'output'.padEnd(20)} output − input`);
for (const [name, worker] of workers) {
  if (worker === null) continue;
  const outputs: ChunkCheck[] = [];
  const added: ChunkCheck[] = [];
  for (const x of inputs) {
    const want = validator(x);
    const got = worker(x);
    const xin = x.data as Float32Array;
    outputs.push(checkChunk(want, commitChunk(got)));
    added.push(checkChunk(want.map((v, i) => v - xin[i]), commitChunk(got.map((v, i) => v - xin[i]))));
  }
  console.log(`${name.padEnd(40)} ${fmt(worst(outputs)).padEnd(20)} ${fmt(worst(added))}`);
}
