import { createModel, gpt2Config, llamaConfig, type ModelConfig, runLayers } from '../src/models/index.ts';
import { Generator, jsBackend, noGrad, randn, type Tensor, trace, withBackend } from '../src/tensor/index.ts';
import { drift, ORT_TOLERANCE } from '../src/verify/compare.ts';

/**
 * How far honest webgpu results drift from the js kernels', against the tolerance a validator
 * re-running a webgpu record on its CPU compares with (ORT_TOLERANCE, float32): sections of 2
 * blocks run forward (as decoding and inference records are) as a step traced on js and
 * compiled on the GPU, over RUNS inputs in all, each compared with js on the same input; and
 * the same results with noise of relative size 1e-3 added, which the tolerance must catch.
 * Prints the largest honest drift, the false positives (honest runs over the tolerance) and
 * the noisy runs caught. On SwiftShader without a GPU (scripts/test.mjs's variables).
 *
 * Run: VK_ICD_FILENAMES=… LD_LIBRARY_PATH=… node --import tsx bench/webgpu-drift.ts [RUNS]
 */

const NOISE = 1e-3;
const RUNS = Number(process.argv[2] ?? 1000);

interface Case {
  name: string;
  config: ModelConfig;
  batch: number;
  tokens: number;
}

const gpt2 = (hidden: number, heads: number, range = 0.02) =>
  gpt2Config({ vocabSize: 256, hidden, layers: 2, heads, maxPositions: 256, initializerRange: range });
const llama = (hidden: number, heads: number, kvHeads: number, intermediate: number, range = 0.02) =>
  llamaConfig({ vocabSize: 256, hidden, layers: 2, heads, kvHeads, intermediate, maxPositions: 256, initializerRange: range });

const CASES: Case[] = [
  { name: 'gpt2 h32', config: gpt2(32, 4), batch: 2, tokens: 16 },
  { name: 'llama h32', config: llama(32, 4, 2, 64), batch: 2, tokens: 16 },
  { name: 'gpt2 h128', config: gpt2(128, 4), batch: 2, tokens: 32 },
  { name: 'llama h128', config: llama(128, 4, 2, 344), batch: 2, tokens: 32 },
  { name: 'gpt2 h256 w×4', config: gpt2(256, 8, 0.08), batch: 1, tokens: 64 },
  { name: 'llama h256 w×4', config: llama(256, 8, 4, 688, 0.08), batch: 1, tokens: 64 },
];

const rows: { case: string; runs: number; honestMax: number; falsePositives: number; noisyCaught: number }[] = [];
const started = performance.now();
for (const [i, c] of CASES.entries()) {
  const runs = Math.floor(RUNS / CASES.length) + (i < RUNS % CASES.length ? 1 : 0);
  const layers = createModel(c.config, { seed: 1 }).layers.slice(1, 3);
  const fn = (x: Tensor) => runLayers(layers, x, {}, c.config.maxPositions);
  const g = new Generator(46 + i);
  const shape = [c.batch, c.tokens, c.config.hidden];
  const { step } = withBackend(jsBackend, () => noGrad(() => trace(fn, [randn(shape, { generator: g })])));
  const noise = new Generator(7);
  let honestMax = 0;
  let falsePositives = 0;
  let noisyCaught = 0;
  for (let r = 0; r < runs; r++) {
    const x = randn(shape, { generator: g });
    const ref = withBackend(jsBackend, () => noGrad(() => fn(x))).data as Float32Array;
    const gpu = (await noGrad(() => step.run([x.to('webgpu')])).read()) as Float32Array;
    const d = drift(ref, gpu);
    honestMax = Math.max(honestMax, d);
    if (d > ORT_TOLERANCE) falsePositives++;
    // noise of relative size NOISE: each value moved by NOISE · rms(output) · a standard normal draw
    const rms = Math.sqrt(gpu.reduce((s, v) => s + v * v, 0) / gpu.length);
    const noisy = gpu.map((v) => v + NOISE * rms * noise.normal());
    if (drift(ref, noisy) > ORT_TOLERANCE) noisyCaught++;
  }
  rows.push({ case: c.name, runs, honestMax, falsePositives, noisyCaught });
}
const seconds = (performance.now() - started) / 1000;
const total = rows.reduce((s, r) => s + r.runs, 0);
for (const r of rows) {
  process.stdout.write(`${r.case.padEnd(16)} ${String(r.runs).padStart(4)} runs  honest drift ≤ ${r.honestMax.toExponential(2)}  `
    + `false positives ${r.falsePositives}  noise 1e-3 caught ${r.noisyCaught}/${r.runs}\n`);
}
process.stdout.write(`${total} honest re-runs between webgpu and js in ${seconds.toFixed(0)} s: ${rows.reduce((s, r) => s + r.falsePositives, 0)} false positives `
  + `at ORT_TOLERANCE ${ORT_TOLERANCE}, the largest drift ${Math.max(...rows.map((r) => r.honestMax)).toExponential(2)}; `
  + `noise of 1e-3 caught in ${rows.reduce((s, r) => s + r.noisyCaught, 0)} of ${total}\n`);
