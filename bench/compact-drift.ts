import { argv } from 'node:process';
import { type CausalLM, createModel, KVCache, type LlamaConfig, llamaConfig } from '../src/models/index.ts';
import { sectionCopy } from '../src/pipeline/index.ts';
import {
  type Backend, createOrtBackend, Generator, jsBackend, noGrad, ortAvailable, packWeight, randint, randn, type Tensor, tensor,
  type WeightFormat, withBackend,
} from '../src/tensor/index.ts';
import { matMulNBitsGraph } from '../src/tensor/backends/ort/packed.ts';
import { loadOrtRuntime, type OrtSession } from '../src/tensor/backends/ort/runtime.ts';
import type { PackedMatrix, QuantFormat } from '../src/tensor/quant/formats.ts';
import { drift, ORT_TOLERANCE, ORT_TOLERANCES } from '../src/verify/compare.ts';

/**
 * How far honest onnxruntime results drift when a section's matrices are held compact (bf16, int8, int4): the
 * calibration of ORT_TOLERANCES (src/verify/compare.ts). A worker's decoding session on a section of 2 Llama blocks
 * (a prompt, then single-token steps, each step's output a record the validator may re-run) runs on:
 *   - ort at 1 and at 2 intra-op threads ('1 vs 2 thr');
 *   - ort's MatMulNBits (accuracy level 4: activations quantized to int8 inside) with every other op on the js kernels
 *     ('float ops'): another CPU's onnxruntime rounds its float ops (attention, norms, softmax) in other low bits, and
 *     those feed the next product's activation quantization: the honest drift between two CPUs that both take the
 *     int8 path;
 *   - ort whose MatMulNBits takes the float path (accuracy level 0: a CPU without the int8 kernels), against the exact
 *     js kernels ('float path');
 *   - ort (int8 path) against js ('ort vs js'): what separates the two honest paths.
 * Each row is the largest relative L2 drift ‖a − b‖₂ / ‖a‖₂ over every step's output; then what some cheats drift by:
 *   - noise of relative size ν added to the honest output (x + ν·‖x‖/√n·N(0, 1));
 *   - one packed byte of one weight changed (computing with it, while sending the weights its record names);
 *   - a coarser format computed than the one held (int8 held, int4 computed; bf16 held, int8 computed);
 *   - the second block skipped (its output is the first block's).
 * The section's input is either the embedding of token ids (the first worker's section: a small residual stream, the
 * blocks' own results dominate) or unit normal hidden states (a deeper section's larger residual stream).
 *
 * For int8 and int4 every drift is that of what the section adds to its input (output − input), as `agree` compares
 * them: the residual stream it passes on unchanged would dilute the drift of its blocks' own work (--outputs: compare
 * the outputs, for every format).
 *
 * Run: node --import tsx bench/compact-drift.ts [--outputs] [--only NAME] [--json]
 */

const FORMATS: readonly WeightFormat[] = ['bf16', 'int8', 'int4'];
/** The noise levels a tolerance is compared with. */
const NOISES = [1e-4, 1e-3, 1e-2] as const;

interface Case {
  name: string;
  config: LlamaConfig;
  /** Prompt tokens (the session's first step), then single-token steps. */
  prompt: number;
  steps: number;
  /** 'embed': the embedding of random ids; 'normal': unit normal hidden states. */
  input: 'embed' | 'normal';
}

const llama = (hidden: number, heads: number, kvHeads: number, intermediate: number, more: Partial<LlamaConfig> = {}) =>
  llamaConfig({ vocabSize: 512, hidden, layers: 2, heads, kvHeads, intermediate, maxPositions: 256, ...more });

const CASES: Case[] = [
  { name: 'h256 embed', config: llama(256, 8, 4, 688), prompt: 32, steps: 4, input: 'embed' },
  { name: 'h256 normal', config: llama(256, 8, 4, 688), prompt: 32, steps: 4, input: 'normal' },
  { name: 'h256 w×4 embed', config: llama(256, 8, 4, 688, { initializerRange: 0.08 }), prompt: 32, steps: 4, input: 'embed' },
  { name: 'h512 embed', config: llama(512, 8, 4, 1376), prompt: 64, steps: 3, input: 'embed' },
  { name: 'h512 w×4 normal', config: llama(512, 8, 4, 1376, { initializerRange: 0.08 }), prompt: 64, steps: 3, input: 'normal' },
  { name: 'h768 embed', config: llama(768, 12, 4, 2048), prompt: 48, steps: 2, input: 'embed' },
  // a deeper section: the quantized activations' drift compounds block after block
  { name: 'h256 8blk embed', config: llama(256, 8, 4, 688, { layers: 8 }), prompt: 32, steps: 3, input: 'embed' },
  { name: 'h256 8blk w×4', config: llama(256, 8, 4, 688, { layers: 8, initializerRange: 0.08 }), prompt: 32, steps: 3, input: 'normal' },
];

type Step = { input: Tensor; positions: Tensor };

/** The section's outputs, step by step, on `backend` (a fresh KV cache). */
function session(model: CausalLM, steps: Step[], backend: Backend): Float32Array[] {
  return withBackend(backend, () => {
    const cache = new KVCache(model.config.layers);
    return steps.map((s) => (noGrad(() => model.forward(s.input, { cache, positions: s.positions })).data as Float32Array).slice());
  });
}

/** The blocks of a seeded Llama (layers [1, L + 1)), each matrix held in `format`. */
function compactSection(config: LlamaConfig, format: WeightFormat, seed: number): CausalLM {
  const part = sectionCopy(createModel(config, { seed }), [1, config.layers + 1]);
  for (const [, t] of part.hfStateDict()) if (t.ndim === 2) packWeight(t, format);
  return part;
}

/** x + ν·‖x‖/√n·N(0, 1) per element: relative L2 distance ≈ ν from x. */
function noisy(x: Float32Array, nu: number, rng: Generator): Float32Array {
  let norm = 0;
  for (const v of x) norm += v * v;
  const scale = (nu * Math.sqrt(norm)) / Math.sqrt(x.length);
  return x.map((v) => v + scale * rng.normal());
}

function stepsOf(c: Case, seed: number): Step[] {
  const h = c.config.hidden;
  const embed = createModel(c.config, { seed: 1 }).layers[0];
  const none = { positions: tensor([0], [1, 1], 'int32'), keyMask: null, cache: null };
  const hidden = (tokens: number, s: number) => (c.input === 'normal'
    ? randn([1, tokens, h], { seed: s })
    : noGrad(() => embed.forward(randint(0, c.config.vocabSize, [1, tokens], { generator: new Generator(s) }), none)));
  const steps: Step[] = [{ input: hidden(c.prompt, seed), positions: tensor(Array.from({ length: c.prompt }, (_, i) => i), [1, c.prompt], 'int32') }];
  for (let i = 0; i < c.steps; i++) steps.push({ input: hidden(1, seed + 1 + i), positions: tensor([c.prompt + i], [1, 1], 'int32') });
  return steps;
}

interface Row {
  case: string;
  format: WeightFormat;
  threads: number;
  floatOps: number;
  floatPath: number;
  ortVsJs: number;
  noise: Record<string, number>;
  byte: number;
  coarser: number;
  skipped: number;
}

/**
 * The metric `agree` applies: for int8/int4 the relative L2 drift of what the section adds to its input (output − input),
 * for bf16 that of the outputs (--outputs: the outputs for every format).
 */
let inputs: Float32Array[] = [];
let CONTRIBUTION = false;
const less = (y: Float32Array, i: number) => (CONTRIBUTION ? y.map((v, j) => v - inputs[i][j]) : y);
const maxDrift = (a: Float32Array[], b: Float32Array[]) => Math.max(...a.map((x, i) => drift(less(x, i), less(b[i], i))));
const minDrift = (a: Float32Array[], b: Float32Array[]) => Math.min(...a.map((x, i) => drift(less(x, i), less(b[i], i))));

interface Backends {
  ort1: Backend;
  ort2: Backend;
  /** js kernels but for MatMulNBits. */
  hybrid: Backend;
  /** ort with MatMulNBits at accuracy level 0. */
  floatPath: Backend;
}

function measure(c: Case, format: WeightFormat, b: Backends): Row {
  const { ort1, ort2 } = b;
  CONTRIBUTION = format !== 'bf16' && !argv.includes('--outputs');
  const model = compactSection(c.config, format, 1);
  const steps = stepsOf(c, 100);
  inputs = steps.map((st) => st.input.data as Float32Array);
  const one = session(model, steps, ort1);
  const two = session(model, steps, ort2);
  const js = session(model, steps, jsBackend);
  const floatOps = maxDrift(one, session(model, steps, b.hybrid));
  const floatPath = maxDrift(js, session(model, steps, b.floatPath));
  const rng = new Generator(7);
  const noise: Record<string, number> = {};
  // noise on what is compared: the output, or what the section added to its input
  const noised = (x: Float32Array, i: number, nu: number) =>
    (CONTRIBUTION ? noisy(less(x, i), nu, rng).map((v, j) => v + inputs[i][j]) : noisy(x, nu, rng));
  for (const nu of NOISES) noise[String(nu)] = minDrift(one, one.map((x, i) => noised(x, i, nu)));
  // one byte of the first block's down projection changed: its first block's first value set to the far end
  const swapped = compactSection(c.config, format, 1);
  const down = [...swapped.hfStateDict()].find(([n]) => n.endsWith('mlp.down_proj.weight'))![1].packed!;
  if (down.format === 'bf16') (down.data as Uint16Array)[0] ^= 0x4000;
  else (down.data as Uint8Array)[0] ^= down.format === 'int8' ? 0x80 : 0x08;
  const byte = minDrift(one, session(swapped, steps, ort1));
  const coarse = compactSection(c.config, format === 'int8' ? 'int4' : format === 'bf16' ? 'int8' : 'int4', 1);
  const coarser = format === 'int4' ? Number.NaN : minDrift(one, session(coarse, steps, ort1));
  // the last block skipped: a section of the blocks before it
  const first = sectionCopy(createModel({ ...c.config, layers: c.config.layers - 1 }, { seed: 1 }), [1, c.config.layers]);
  for (const [, t] of first.hfStateDict()) if (t.ndim === 2) packWeight(t, format);
  const skipped = minDrift(one, session(first, steps, ort1));
  const ortVsJs = Math.max(maxDrift(js, one), maxDrift(js, two));
  return { case: c.name, format, threads: maxDrift(one, two), floatOps, floatPath, ortVsJs, noise, byte, coarser, skipped };
}

const fmt = (x: number) => (Number.isNaN(x) ? '—' : x === 0 ? '0' : x.toExponential(2));

function main(): void {
  if (!ortAvailable()) {
    console.log('onnxruntime does not load here: nothing to calibrate');
    return;
  }
  const ort1 = createOrtBackend({ threads: 1 });
  const ort2 = createOrtBackend({ threads: 2 });
  const hybrid: Backend = { ...jsBackend, name: 'ort', deterministic: false, packedLinear: (x, m, w, y) => ort1.packedLinear!(x, m, w, y) };
  const runtime = loadOrtRuntime();
  const acc0 = new WeakMap<PackedMatrix, OrtSession>();
  // ort's own kernels, each product with a compact weight on its own (no fused graph: they would take the int8 path)
  const floatPath: Backend = {
    name: 'ort',
    deterministic: false,
    matmul: (...args) => ort1.matmul(...args),
    unary: (...args) => ort1.unary!(...args),
    unaryBackward: (...args) => ort1.unaryBackward!(...args),
    softmax: (...args) => ort1.softmax!(...args),
    layerNorm: (...args) => ort1.layerNorm!(...args),
    packedLinear: (x, m, w, y) => {
      if (w.format === 'bf16' || m * w.rows * w.cols < 32 * 1024) return ort1.packedLinear!(x, m, w, y);
      let s = acc0.get(w);
      if (!s) acc0.set(w, (s = runtime.session(matMulNBitsGraph(w as PackedMatrix & { format: QuantFormat }, 0), 1, false)));
      s.run([{ name: 'a', data: x, dims: [m, w.cols] }], [{ name: 'y', data: y, dims: [m, w.rows] }]);
      return true;
    },
  };
  const rows: Row[] = [];
  console.log('compact sections on ort: drift (relative L2) of each decoding step\'s output (int8/int4: of output − input unless --outputs); '
    + 'honest: max over steps, cheats: min over steps');
  const head = ['case'.padEnd(16), 'format', '1 vs 2 thr'.padStart(10), 'float ops'.padStart(10), 'float path'.padStart(10), 'ort vs js'.padStart(10), ...NOISES.map((n) => `noise ${n}`.padStart(11)),
    'one byte'.padStart(9), 'coarser'.padStart(9), 'skip blk'.padStart(9)];
  console.log(head.join(' '));
  const only = argv.indexOf('--only');
  for (const c of only < 0 ? CASES : CASES.filter((x) => x.name.includes(argv[only + 1]))) {
    const t0 = performance.now();
    for (const format of FORMATS) {
      const r = measure(c, format, { ort1, ort2, hybrid, floatPath });
      rows.push(r);
      console.log([r.case.padEnd(16), r.format.padEnd(6), fmt(r.threads).padStart(10), fmt(r.floatOps).padStart(10),
        fmt(r.floatPath).padStart(10), fmt(r.ortVsJs).padStart(10),
        ...NOISES.map((n) => fmt(r.noise[String(n)]).padStart(11)), fmt(r.byte).padStart(9), fmt(r.coarser).padStart(9), fmt(r.skipped).padStart(9)].join(' '));
    }
    console.log(`${''.padEnd(16)} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
  }
  for (const format of FORMATS) {
    const of = rows.filter((r) => r.format === format);
    const threads = Math.max(...of.map((r) => r.threads));
    const ops = Math.max(...of.map((r) => r.floatOps));
    const path = Math.max(...of.map((r) => r.floatPath));
    const tol = ORT_TOLERANCES[format];
    console.log(`${format}: worst honest drift: 1 vs 2 threads ${fmt(threads)}, float ops ${fmt(ops)} (tolerance ${tol}: ${fmt(tol / Math.max(threads, ops))}× above); `
      + `float path vs js ${fmt(path)} (ORT_TOLERANCE ${ORT_TOLERANCE}: ${fmt(ORT_TOLERANCE / path)}× above); `
      + `cheats below it: one byte ${of.filter((r) => r.byte <= tol).length}/${of.length}, coarser ${of.filter((r) => r.coarser <= tol).length}/${of.length}, `
      + `skipped block ${of.filter((r) => r.skipped <= tol).length}/${of.length}`);
  }
  if (argv.includes('--json')) console.log(JSON.stringify({ tolerances: ORT_TOLERANCES, rows }));
}

main();
