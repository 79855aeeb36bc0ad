import { mkdirSync, writeFileSync } from 'node:fs';
import { argv } from 'node:process';
import { type CausalLM, createModel, DeviceRunner, gpt2Config, KVCache, llamaConfig, type ModelConfig } from '../src/models/index.ts';
import { sectionCopy } from '../src/pipeline/index.ts';
import {
  type Backend, createOrtBackend, Generator, jsBackend, loadBackend, noGrad, ortAvailable, packWeight, randint, randn, type Tensor, tensor,
  trace, type TracedStep, type WeightFormat, withBackend,
} from '../src/tensor/index.ts';
import { drift } from '../src/verify/compare.ts';
import { COMMIT_THRESHOLDS, type CommitBound } from '../src/verify/commitment.ts';
import { type ChunkCheck, checkChunk, COMMIT_CHUNK, commitChunk } from '../src/verify/records/commit.ts';

/**
 * The calibration of activation-commitment thresholds (#47, src/verify/records/commit.ts after TOPLOC): per announced
 * weight format (f32, bf16, int8, int4), how far honest workers' commitments lie from a validator's recomputation, and
 * how far cheats' do. A chunk is COMMIT_CHUNK (32) positions of one row; its values are what the section added to its
 * input (output − input), flattened, top-128 by |x|. The validator recomputes the section by one causal prefill with the
 * announced weights on js or on ort (1 thread, default sizes) and checks the worker's commitment (checkChunk).
 *   - Honest workers, all computing in the announced format: js, ort at 1 and 2 threads (eager), ort as one compiled
 *     graph, ort decoding token by token with a KV cache (the real path of a hosted session), and where an adapter is at
 *     hand webgpu as one graph and webgpu decoding through a DeviceRunner (small cases; SwiftShader here). Pairs whose
 *     two sides are the same computation (js → js, ort 1 thread → ort) are left out: they agree bit for bit.
 *   - Cheats (each made on js and on ort, checked by both validators): noise 1e-3 and 1e-2 relative to the output
 *     (worker/fault.ts's noisy), skip (the input returned), zero, replay (another input's output), substitute:int4
 *     (matrices held in int4 while a finer format is announced), substitute:int8 (for f32, bf16), substitute:other (the
 *     section of another seed, same shape and format).
 * Sections: Llama of 2 and 8 blocks at hidden 256 and 2 at 512, GPT-2 layout 2 blocks at 256; initial weights and 4×
 * (sharper, as after training); inputs unit normal hidden states or the embedding of random ids; SEEDS inputs each of
 * 2 rows × 64 positions (4 chunks). Prints, per format, the worst honest figures (max over every chunk) and per cheat
 * the smallest (the best cheat), with the chunks that pass COMMIT_THRESHOLDS; writes every chunk's figures to
 * bench/out/commit-drift.json. Also the relative L2 drift of output − input over each input (compare.ts's `drift`).
 *
 * Run: VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json LD_LIBRARY_PATH=/usr/lib/chromium \
 *      node --import tsx bench/commit-drift.ts [--seeds N] [--only NAME] [--no-webgpu]
 * (--seeds 2, the default: ~10 min on 2 shared cores; --seeds 3, the calibration run: ~13 min.)
 */

type Format = 'f32' | WeightFormat;
const FORMATS: readonly Format[] = ['f32', 'bf16', 'int8', 'int4'];
type Thresholds = CommitBound;
/** The bounds the validator applies (src/verify/commitment.ts): every chunk is judged by them, honest and cheat alike. */
const PROPOSED: Readonly<Record<Format, Thresholds>> = COMMIT_THRESHOLDS;
const flag = (name: string) => argv.indexOf(name);
const SEEDS = flag('--seeds') > 0 ? Number(argv[flag('--seeds') + 1]) : 2;
const ROWS = 2;
const POSITIONS = 64;

/** webgpu: none, one graph per input, or that and decoding (f32 and int8 on the first input only: ~15 s a session on SwiftShader). */
interface Case { name: string; config: ModelConfig; input: 'embed' | 'normal'; decode: boolean; webgpu: false | 'graph' | 'decode' }
const llama = (hidden: number, layers: number, range = 0.02) => llamaConfig({
  vocabSize: 512, hidden, layers, heads: 8, kvHeads: 4, intermediate: Math.round((hidden * 8) / 3), maxPositions: 128,
  initializerRange: range,
});
const gpt2 = (hidden: number, range = 0.02) =>
  gpt2Config({ vocabSize: 512, hidden, layers: 2, heads: 8, maxPositions: 128, initializerRange: range });
const CASES: Case[] = [
  { name: 'llama h256 2blk normal', config: llama(256, 2), input: 'normal', decode: true, webgpu: 'decode' },
  { name: 'llama h256 2blk embed', config: llama(256, 2), input: 'embed', decode: true, webgpu: false },
  { name: 'llama h256 2blk w×4 normal', config: llama(256, 2, 0.08), input: 'normal', decode: false, webgpu: false },
  { name: 'llama h256 2blk w×4 embed', config: llama(256, 2, 0.08), input: 'embed', decode: true, webgpu: 'graph' },
  { name: 'llama h256 8blk embed', config: llama(256, 8), input: 'embed', decode: true, webgpu: false },
  { name: 'llama h256 8blk w×4 normal', config: llama(256, 8, 0.08), input: 'normal', decode: true, webgpu: false },
  { name: 'llama h512 2blk embed', config: llama(512, 2), input: 'embed', decode: false, webgpu: false },
  { name: 'llama h512 2blk w×4 normal', config: llama(512, 2, 0.08), input: 'normal', decode: true, webgpu: false },
  { name: 'gpt2 h256 2blk embed', config: gpt2(256), input: 'embed', decode: true, webgpu: false },
  { name: 'gpt2 h256 2blk w×4 normal', config: gpt2(256, 0.08), input: 'normal', decode: false, webgpu: 'graph' },
];

/** The blocks of a seeded model (layers [1, L + 1)), the 2-D matrices held in `format`. */
function section(config: ModelConfig, seed: number, format: Format): CausalLM {
  const part = sectionCopy(createModel(config, { seed }), [1, config.layers + 1]);
  if (format !== 'f32') for (const [, t] of part.hfStateDict()) if (t.ndim === 2) packWeight(t, format);
  return part;
}

type Run = (model: CausalLM, x: Tensor) => Float32Array | Promise<Float32Array>;
const positionsOf = (from: number, t: number) => tensor(Array.from({ length: ROWS * t }, (_, i) => from + (i % t)), [ROWS, t], 'int32');
const prefill = (backend: Backend): Run => (model, x) =>
  withBackend(backend, () => noGrad(() => (model.forward(x).data as Float32Array).slice()));
/** Token by token with a KV cache, both rows at once, on `backend`: the outputs laid out as a prefill's [ROWS, T, H]. */
const decode = (backend: Backend): Run => (model, x) => withBackend(backend, () => noGrad(() => {
  const [, t, h] = x.shape;
  const xs = x.data as Float32Array;
  const out = new Float32Array(xs.length);
  const cache = new KVCache(model.config.layers);
  for (let p = 0; p < t; p++) {
    const step = new Float32Array(ROWS * h);
    for (let b = 0; b < ROWS; b++) step.set(xs.subarray((b * t + p) * h, (b * t + p + 1) * h), b * h);
    const y = model.forward(tensor(step, [ROWS, 1, h]), { cache, positions: positionsOf(p, 1) }).data as Float32Array;
    for (let b = 0; b < ROWS; b++) out.set(y.subarray(b * h, (b + 1) * h), (b * t + p) * h);
  }
  return out;
}));
/** The forward traced on js and run as one graph on `backend` (ort's CPU graph, or webgpu). */
const traced = new WeakMap<CausalLM, TracedStep<Tensor>>();
const graph = (backend: Backend): Run => async (model, x) => {
  let step = traced.get(model);
  if (!step) traced.set(model, (step = withBackend(jsBackend, () => noGrad(() => trace((v: Tensor) => model.forward(v), [x]))).step));
  // a webgpu step runs where its inputs live; an ort step on host tensors under ort
  const y = backend.name === 'webgpu' ? noGrad(() => step.run([x.to('webgpu')])) : withBackend(backend, () => noGrad(() => step.run([x])));
  const out = (await y.read()) as Float32Array;
  if (backend.name === 'webgpu') y.dispose();
  return out.slice();
};
/** Decoding on webgpu as a GPU worker's sessions do (DeviceRunner: the cache on the device, each step one graph). */
const deviceDecode: Run = async (model, x) => {
  const [, t, h] = x.shape;
  const xs = x.data as Float32Array;
  const out = new Float32Array(xs.length);
  const runner = new DeviceRunner(model, 'webgpu');
  for (let p = 0; p < t; p++) {
    const step = new Float32Array(ROWS * h);
    for (let b = 0; b < ROWS; b++) step.set(xs.subarray((b * t + p) * h, (b * t + p + 1) * h), b * h);
    const y = (await runner.step(tensor(step, [ROWS, 1, h]), { positions: positionsOf(p, 1) })).data as Float32Array;
    for (let b = 0; b < ROWS; b++) out.set(y.subarray(b * h, (b + 1) * h), (b * t + p) * h);
  }
  runner.reset();
  return out;
};

function inputOf(c: Case, seed: number): Tensor {
  const h = c.config.hidden;
  if (c.input === 'normal') return randn([ROWS, POSITIONS, h], { seed });
  const embed = createModel(c.config, { seed: 1 }).layers[0];
  const ids = randint(0, c.config.vocabSize, [ROWS, POSITIONS], { generator: new Generator(seed) });
  const ctx = { positions: positionsOf(0, POSITIONS), keyMask: null, cache: null };
  return withBackend(jsBackend, () => noGrad(() => embed.forward(ids, ctx)));
}

/** x + ν·rms(x)·N(0, 1) per element (worker/fault.ts's noisy, ν = 1e-3 there). */
function noisy(y: Float32Array, nu: number, rng: Generator): Float32Array {
  let sq = 0;
  for (const v of y) sq += v * v;
  const sigma = (nu * Math.sqrt(sq)) / Math.sqrt(y.length);
  return y.map((v) => v + sigma * rng.normal());
}

/** The ROWS × (POSITIONS / COMMIT_CHUNK) chunks of output − input, each [COMMIT_CHUNK × H] flattened. */
function chunksOf(y: Float32Array, x: Float32Array): Float32Array[] {
  const added = y.map((v, i) => v - x[i]);
  const size = (y.length / ROWS / POSITIONS) * COMMIT_CHUNK;
  return Array.from({ length: y.length / size }, (_, j) => added.subarray(j * size, (j + 1) * size));
}

interface Row { case: string; input: number; format: Format; kind: 'honest' | 'cheat'; name: string; validator: string; drift: number; checks: ChunkCheck[] }
const rows: Row[] = [];
/** The input (seed index) being checked. */
let inputIndex = 0;

type Validators = Map<string, Float32Array>;
/** Commits `got`'s chunks as the worker would and checks them against each validator's (but `skip`, the same computation). */
function check(c: Case, format: Format, kind: Row['kind'], name: string, x: Float32Array, got: Float32Array, validators: Validators, skip?: string): void {
  const input = inputIndex;
  const proofs = chunksOf(got, x).map((v) => commitChunk(v));
  for (const [vname, want] of validators) {
    if (vname === skip) continue;
    const checks = chunksOf(want, x).map((v, j) => checkChunk(v, proofs[j]));
    rows.push({ case: c.name, input, format, kind, name, validator: vname, drift: drift(want, got, x), checks });
  }
}

async function measure(c: Case, format: Format, b: { ort1: Backend; ort2: Backend; gpu: Backend | null }): Promise<void> {
  const model = section(c.config, 1, format);
  const honest: [string, Run, string?][] = [
    ['js', prefill(jsBackend), 'js'], ['ort 1 thr', prefill(b.ort1), 'ort'], ['ort 2 thr', prefill(b.ort2)], ['ort graph', graph(b.ort1)],
  ];
  if (c.decode) honest.push(['ort decode', decode(b.ort1)]);
  if (c.webgpu && b.gpu) honest.push(['webgpu graph', graph(b.gpu)]);
  const gpuDecode = c.webgpu === 'decode' && b.gpu !== null && (format === 'f32' || format === 'int8');
  const subs: [string, CausalLM][] = [['substitute:other', section(c.config, 2, format)]];
  if (format !== 'int4') subs.push(['substitute:int4', section(c.config, 1, 'int4')]);
  if (format === 'f32' || format === 'bf16') subs.push(['substitute:int8', section(c.config, 1, 'int8')]);
  const xs = Array.from({ length: SEEDS }, (_, s) => inputOf(c, 100 + s));
  const js = prefill(jsBackend);
  const ort = prefill(b.ort1);
  const outs = xs.map((x) => ({ js: js(model, x) as Float32Array, ort: ort(model, x) as Float32Array }));
  const rng = new Generator(9);
  for (const [s, x] of xs.entries()) {
    const xd = x.data as Float32Array;
    inputIndex = s;
    const validators = new Map([['js', outs[s].js], ['ort', outs[s].ort]]);
    for (const [name, run, same] of gpuDecode && s === 0 ? [...honest, ['webgpu decode', deviceDecode] as const] : honest) {
      let y: Float32Array;
      try {
        y = await run(model, x);
      } catch (e) {
        if (s === 0) console.log(`  ${c.name} ${format} ${name}: not run (${(e as Error).message.split('\n')[0].slice(0, 120)})`);
        continue;
      }
      check(c, format, 'honest', name, xd, y, validators, same);
    }
    for (const [on, y] of [['js', outs[s].js], ['ort', outs[s].ort]] as const) {
      check(c, format, 'cheat', `noise 1e-3 (${on})`, xd, noisy(y, 1e-3, rng), validators);
      check(c, format, 'cheat', `noise 1e-2 (${on})`, xd, noisy(y, 1e-2, rng), validators);
      check(c, format, 'cheat', `replay (${on})`, xd, outs[(s + 1) % SEEDS][on], validators);
      for (const [name, m] of subs) check(c, format, 'cheat', `${name} (${on})`, xd, await (on === 'js' ? js : ort)(m, x), validators);
    }
    check(c, format, 'cheat', 'skip', xd, xd.slice(), validators);
    check(c, format, 'cheat', 'zero', xd, new Float32Array(xd.length), validators);
  }
}

const passes = (k: ChunkCheck, t: Thresholds) => k.expMismatches <= t.exp && k.mantMean <= t.mean && k.mantMedian <= t.median;
const num = (x: number, d = 2) => (x === Infinity ? '∞' : Number.isInteger(x) ? String(x) : x.toFixed(d));
const sci = (x: number) => (x === 0 ? '0' : x === Infinity ? '∞' : x.toExponential(1));

function summary(): void {
  for (const format of FORMATS) {
    const of = rows.filter((r) => r.format === format);
    if (of.length === 0) continue;
    const t = PROPOSED[format];
    const honest = of.filter((r) => r.kind === 'honest');
    const hc = honest.flatMap((r) => r.checks);
    console.log(`\n${format}: ${hc.length} honest chunks; bounds exp ≤ ${t.exp}, mean ≤ ${t.mean}, median ≤ ${t.median}`);
    const head = (what: string, m: string, last: string) => console.log(`${what.padEnd(30)} ${'chunks'.padStart(6)} ${`${m} exp`.padStart(7)} `
      + `${`${m} mean`.padStart(8)} ${`${m} med`.padStart(7)} ${`${m} L2`.padStart(8)} ${last.padStart(5)}`);
    head('honest worker → validator', 'max', 'fail');
    const groups = new Map<string, Row[]>();
    for (const r of honest) groups.set(`${r.name} → ${r.validator}`, [...(groups.get(`${r.name} → ${r.validator}`) ?? []), r]);
    const line = (name: string, rs: Row[], best: boolean) => {
      const ks = rs.flatMap((r) => r.checks);
      const pick = best ? Math.min : Math.max;
      const fails = ks.filter((k) => (best ? passes(k, t) : !passes(k, t))).length;
      console.log(`${name.padEnd(30)} ${String(ks.length).padStart(6)} ${num(pick(...ks.map((k) => k.expMismatches))).padStart(7)} `
        + `${num(pick(...ks.map((k) => k.mantMean))).padStart(8)} ${num(pick(...ks.map((k) => k.mantMedian))).padStart(7)} `
        + `${sci(pick(...rs.map((r) => r.drift))).padStart(8)} ${String(fails).padStart(5)}`);
    };
    for (const [name, rs] of groups) line(name, rs, false);
    line('ALL HONEST', honest, false);
    head('cheat (min over chunks)', 'min', 'pass');
    const kinds = new Map<string, Row[]>();
    for (const r of of.filter((r) => r.kind === 'cheat')) {
      const kind = r.name.replace(/ \((js|ort)\)$/, '');
      kinds.set(kind, [...(kinds.get(kind) ?? []), r]);
    }
    for (const [kind, rs] of kinds) line(kind, rs, true);
  }
}

if (!ortAvailable()) {
  console.log('onnxruntime does not load here: nothing to calibrate');
} else {
  const started = performance.now();
  let gpu: Backend | null = null;
  if (flag('--no-webgpu') < 0) {
    try {
      gpu = loadBackend('webgpu');
    } catch (e) {
      console.log(`webgpu rows skipped: ${(e as Error).message.split('\n')[0]}`);
    }
  }
  const b = { ort1: createOrtBackend({ threads: 1 }), ort2: createOrtBackend({ threads: 2 }), gpu };
  const only = flag('--only');
  for (const c of only < 0 ? CASES : CASES.filter((x) => x.name.includes(argv[only + 1]))) {
    const t0 = performance.now();
    for (const format of FORMATS) await measure(c, format, b);
    console.log(`${c.name}: ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  }
  summary();
  const seconds = (performance.now() - started) / 1000;
  console.log(`\n${rows.filter((r) => r.kind === 'honest').reduce((s, r) => s + r.checks.length, 0)} honest chunks checked in all; ${seconds.toFixed(0)} s`);
  mkdirSync('bench/out', { recursive: true });
  const json = { proposed: PROPOSED, seeds: SEEDS, rows: ROWS, positions: POSITIONS, seconds, results: rows };
  writeFileSync('bench/out/commit-drift.json', JSON.stringify(json, (_, v) => (v === Infinity ? 'Infinity' : v)));
}
