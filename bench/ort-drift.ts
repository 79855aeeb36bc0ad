import { argv } from 'node:process';
import {
  createModel, type GPT2Config, gpt2Config, layerParameters, type LlamaConfig, llamaConfig, type ModelConfig, type ModelLayer, runLayers,
  type SectionRange,
} from '../src/models/index.ts';
import {
  type Backend, createOrtBackend, Generator, jsBackend, ortAvailable, randn, type Tensor, withBackend,
} from '../src/tensor/index.ts';
import { drift, ORT_TOLERANCE } from '../src/verify/compare.ts';

/**
 * How far honest onnxruntime results drift: the calibration of ORT_TOLERANCE (src/verify/compare.ts).
 * For each config, a worker's section (2 blocks, or the final norm and head) runs forward and
 * backward (input gradient and every parameter gradient) on ort at 1 and at 2 intra-op threads
 * and on the js kernels, over a few inputs. A row gives the largest relative L2 drift
 * ‖a − b‖₂ / ‖a‖₂ between two of those, and that of noise of relative size 1e-3 added to the
 * 1-thread result (the smallest a cheat could hide in would have to stay below the tolerance).
 *
 * Run: node --import tsx bench/ort-drift.ts [--json]
 */

/** Relative size of the noise a tolerance must catch. */
const NOISE = 1e-3;

interface Case {
  name: string;
  config: ModelConfig;
  section: SectionRange;
  batch: number;
  tokens: number;
  /** Inputs drawn (each one forward and backward per backend). */
  inputs: number;
}

const blocks: SectionRange = [1, 3];
/** The final norm and the head of a 2-block model. */
const head: SectionRange = [3, 5];
const gpt2 = (hidden: number, heads: number, more: Partial<GPT2Config> = {}) =>
  gpt2Config({ vocabSize: 256, hidden, layers: 2, heads, maxPositions: 256, ...more });
const llama = (hidden: number, heads: number, kvHeads: number, intermediate: number, more: Partial<LlamaConfig> = {}) =>
  llamaConfig({ vocabSize: 256, hidden, layers: 2, heads, kvHeads, intermediate, maxPositions: 256, ...more });

const CASES: Case[] = [
  { name: 'gpt2 h32', config: gpt2(32, 4), section: blocks, batch: 2, tokens: 16, inputs: 4 },
  { name: 'llama h32', config: llama(32, 4, 2, 64), section: blocks, batch: 2, tokens: 16, inputs: 4 },
  { name: 'gpt2 h128', config: gpt2(128, 4), section: blocks, batch: 2, tokens: 32, inputs: 3 },
  { name: 'llama h128', config: llama(128, 4, 2, 344), section: blocks, batch: 2, tokens: 32, inputs: 3 },
  { name: 'gpt2 h256', config: gpt2(256, 8), section: blocks, batch: 2, tokens: 64, inputs: 3 },
  { name: 'llama h256', config: llama(256, 8, 4, 688), section: blocks, batch: 2, tokens: 64, inputs: 3 },
  { name: 'gpt2 h256 head', config: gpt2(256, 8, { vocabSize: 4096 }), section: head, batch: 2, tokens: 64, inputs: 2 },
  { name: 'llama h512', config: llama(512, 8, 4, 1376), section: blocks, batch: 1, tokens: 128, inputs: 2 },
  { name: 'gpt2 h768', config: gpt2(768, 12), section: blocks, batch: 1, tokens: 128, inputs: 2 },
  // Stress: weights 4× the initial scale (sharper attention, larger activations, as training leaves them), and 4 blocks.
  { name: 'gpt2 h256 w×4', config: gpt2(256, 8, { initializerRange: 0.08 }), section: blocks, batch: 2, tokens: 64, inputs: 2 },
  { name: 'llama h256 w×4', config: llama(256, 8, 4, 688, { initializerRange: 0.08 }), section: blocks, batch: 2, tokens: 64, inputs: 2 },
  { name: 'llama h256 4blk', config: llama(256, 8, 4, 688, { layers: 4 }), section: [1, 5], batch: 2, tokens: 64, inputs: 2 },
];

/** What one forward and backward of a section gives: its output and the gradients. */
interface Results {
  forward: Float32Array;
  inputGrad: Float32Array;
  params: Map<string, Float32Array>;
}

/** A worker's section with initialised weights (`createModel` leaves a section's weights zero, to be loaded). */
interface Section {
  layers: ModelLayer[];
  params: Map<string, Tensor>;
  maxPositions: number;
}

function section(config: ModelConfig, range: SectionRange, seed: number): Section {
  const layers = createModel(config, { seed }).layers.slice(range[0], range[1]);
  return { layers, params: layerParameters(layers), maxPositions: config.maxPositions };
}

/** The section's forward on `input` and backward from `grad`, on `backend` (as StageExecutor runs them); every result copied out. */
function runSection(s: Section, input: Tensor, grad: Tensor, backend: Backend): Results {
  return withBackend(backend, () => {
    for (const p of s.params.values()) p.grad = null;
    const x = input.detach();
    x.requiresGrad = true;
    const y = runLayers(s.layers, x, {}, s.maxPositions);
    const forward = (y.data as Float32Array).slice();
    y.backward(grad);
    const params = new Map<string, Float32Array>();
    for (const [name, p] of s.params) params.set(name, (p.grad!.data as Float32Array).slice());
    return { forward, inputGrad: (x.grad!.data as Float32Array).slice(), params };
  });
}

/** x + NOISE·‖x‖/√n·N(0, 1) per element: relative L2 distance ≈ NOISE from x. */
function noisy(x: Float32Array, rng: Generator): Float32Array {
  let norm = 0;
  for (const v of x) norm += v * v;
  const scale = (NOISE * Math.sqrt(norm)) / Math.sqrt(x.length);
  return x.map((v) => v + scale * rng.normal());
}

interface Row {
  case: string;
  tokens: number;
  quantity: string;
  threads: number;
  ortVsJs: number;
  noise: number;
  /** The parameter whose gradient drifted most (threads or js), for the parameter row. */
  worst?: string;
}

function measure(c: Case, ort1: Backend, ort2: Backend): Row[] {
  const model = section(c.config, c.section, 1);
  const h = c.config.hidden;
  const rng = new Generator(99);
  const acc = new Map<string, Row>();
  const row = (quantity: string) => {
    let r = acc.get(quantity);
    if (!r) acc.set(quantity, (r = { case: c.name, tokens: c.batch * c.tokens, quantity, threads: 0, ortVsJs: 0, noise: Infinity }));
    return r;
  };
  const record = (quantity: string, name: string, one: Float32Array, two: Float32Array, js: Float32Array) => {
    const r = row(quantity);
    const threads = drift(one, two);
    const vsJs = Math.max(drift(js, one), drift(js, two));
    if (Math.max(threads, vsJs) > Math.max(r.threads, r.ortVsJs)) r.worst = name;
    r.threads = Math.max(r.threads, threads);
    r.ortVsJs = Math.max(r.ortVsJs, vsJs);
    r.noise = Math.min(r.noise, drift(one, noisy(one, rng)));
  };
  for (let i = 0; i < c.inputs; i++) {
    const input = randn([c.batch, c.tokens, h], { seed: 1000 + i });
    const outShape = c.section === head ? [c.batch, c.tokens, c.config.vocabSize] : [c.batch, c.tokens, h];
    const grad = randn(outShape, { seed: 2000 + i }).mul(1 / Math.sqrt(c.batch * c.tokens));
    const one = runSection(model, input, grad, ort1);
    const two = runSection(model, input, grad, ort2);
    const js = runSection(model, input, grad, jsBackend);
    record('forward', 'output', one.forward, two.forward, js.forward);
    record('input grad', 'input', one.inputGrad, two.inputGrad, js.inputGrad);
    for (const [name, g] of one.params) record('param grads', name, g, two.params.get(name)!, js.params.get(name)!);
  }
  return [...acc.values()];
}

const fmt = (x: number) => (x === 0 ? '0' : x.toExponential(2));

function main(): void {
  if (!ortAvailable()) {
    console.log('onnxruntime does not load here: nothing to calibrate');
    return;
  }
  // Every op on ort, whatever its size, so that the small configs exercise MLAS too.
  const all = { minMacs: 0, minElements: 0 };
  const ort1 = createOrtBackend({ threads: 1, ...all });
  const ort2 = createOrtBackend({ threads: 2, ...all });
  const rows: Row[] = [];
  console.log(`ort drift (relative L2), max over inputs; noise ${NOISE} relative, min over outputs; ORT_TOLERANCE ${ORT_TOLERANCE}`);
  console.log(['case'.padEnd(16), 'tokens'.padStart(6), 'quantity'.padEnd(12), '1 vs 2 thr'.padStart(10), 'ort vs js'.padStart(10),
    'noise'.padStart(9), '  worst tensor'].join(' '));
  for (const c of CASES) {
    const t0 = performance.now();
    for (const r of measure(c, ort1, ort2)) {
      rows.push(r);
      console.log([r.case.padEnd(16), String(r.tokens).padStart(6), r.quantity.padEnd(12), fmt(r.threads).padStart(10),
        fmt(r.ortVsJs).padStart(10), fmt(r.noise).padStart(9), `  ${r.worst ?? ''}`].join(' '));
    }
    console.log(`${''.padEnd(16)} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
  }
  const worstThreads = Math.max(...rows.map((r) => r.threads));
  const worstJs = Math.max(...rows.map((r) => r.ortVsJs));
  const minNoise = Math.min(...rows.map((r) => r.noise));
  const honest = Math.max(worstThreads, worstJs);
  console.log(`worst honest drift: 1 vs 2 threads ${fmt(worstThreads)}, ort vs js ${fmt(worstJs)}; smallest noise drift ${fmt(minNoise)}`);
  console.log(`geometric mean √(honest · noise) ${fmt(Math.sqrt(honest * minNoise))}; ORT_TOLERANCE ${ORT_TOLERANCE}: `
    + `${fmt(ORT_TOLERANCE / honest)}× above honest, ${fmt(minNoise / ORT_TOLERANCE)}× below noise`);
  if (argv.includes('--json')) console.log(JSON.stringify({ tolerance: ORT_TOLERANCE, worstThreads, worstJs, minNoise, rows }));
}

main();
