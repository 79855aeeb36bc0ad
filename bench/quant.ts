import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { fortunesDataset, textBatch } from '../src/data/index.ts';
import { byteLevelTokenizerJson, configToHF, createModel, hfToGGUF, HFTokenizer, llamaConfig, LocalTrainer, saveModel } from '../src/models/index.ts';
import { createOrtBackend, Generator, setBackend } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';
import type { ChildJob, ChildResult } from './quant-child.ts';
import { cpuTargets, wholeStepRows } from './quant-targets.ts';
import { runTsChild } from './child-json.ts';

/**
 * Compact weights against llama.cpp on the same weights: a Llama-shaped model of about 100M parameters (byte-level
 * vocabulary, trained briefly on fortunes), exported to GGUF at F32, Q8_0 and Q4_0; ours loads each file (f32, and
 * Q8_0 / Q4_0 blocks held as int8 / int4 as they are, ort backend, MatMulNBits) and llama.cpp (node-llama-cpp)
 * runs the same file. Each variant runs in its own process: decode tokens/s (one token a step after the prompt,
 * KV cache), peak resident memory (VmHWM), held-out perplexity on fortunes, greedy tokens. Above 1 thread, ours at
 * int8 / int4 also runs with onnxruntime's spinning pool off (the backend's 'auto' spins for products this small).
 * Ours at int8 / int4 also decodes with the whole step as one onnxruntime graph (quant-targets.ts), against which
 * the CPU targets of #46 are stated, met or not.
 *
 * llama.cpp comes from bench/llama-cpp (its own package, ~730 MB of prebuilt binaries, kept out of the root
 * install): `npm ci --prefix bench/llama-cpp`. Without it the llama.cpp rows are skipped with that message.
 */

/** The model: 16 blocks 768 wide (12 heads, 4 KV heads), SwiGLU 2048, byte-level vocabulary: 100.9M parameters. */
const CONFIG = llamaConfig({
  vocabSize: 257, hidden: 768, heads: 12, kvHeads: 4, layers: 16, intermediate: 2048, maxPositions: 512,
  tieWordEmbeddings: true, bosTokenId: 256, eosTokenId: 256,
});
const SEED = 7;
/**
 * Training: one step of 8 × 64 tokens takes ~5.5 s on this 2-core VM (ort, 2 threads), so a few hundred steps (the
 * issue's wish) would take half an hour: the bench trains TRAIN_STEPS steps (~3 min) and says so in its rows.
 */
const TRAIN_STEPS = 32;
const QUICK_TRAIN_STEPS = 4;
/** Training stops early past this (the VM is shared: a step can take several times longer); the rows say how many steps ran. */
const TRAIN_SECONDS = 200;
const BATCH = 8;
const SEQ = 64;
const LR = 1e-3;
const PROMPT = 'Q: What is the difference between a duck?\nA: ';
/** Tokens decoded per variant; the greedy comparison uses the first GREEDY of them. */
const DECODE = 48;
/** Prompt + decode rounds per variant (each from an empty cache); the best counts (this VM is shared). */
const ROUNDS = 2;
const GREEDY = 24;
/** Held-out perplexity: EVAL_WINDOWS windows of EVAL_SEQ tokens from the start of the held-out fortunes. */
const EVAL_SEQ = 128;
const EVAL_WINDOWS = 16;

export const FORMATS = [
  { ours: 'f32', gguf: 'F32', type: 'f32' },
  { ours: 'int8', gguf: 'Q8_0', type: 'q8_0' },
  { ours: 'int4', gguf: 'Q4_0', type: 'q4_0' },
] as const;
export type Format = (typeof FORMATS)[number]['ours'];

const OUT = fileURLToPath(new URL('./out/quant/', import.meta.url));
const LLAMA_DIR = fileURLToPath(new URL('./llama-cpp/', import.meta.url));
const LLAMA_MODULE = `${LLAMA_DIR}node_modules/node-llama-cpp/dist/index.js`;
export const LLAMA_INSTALL = 'npm ci --prefix bench/llama-cpp';

const log = (s: string) => process.stderr.write(`${s}\n`);
const mb = (bytes: number) => bytes / 2 ** 20;
const met = (ok: boolean) => (ok ? 'met' : 'NOT met');

interface Prepared {
  files: Record<Format, string>;
  steps: number;
  trainSeconds: number;
  firstLoss: number;
  lastLoss: number;
  params: number;
  float32Bytes: number;
}

/** Trains (or reuses a model trained with the same settings earlier) and exports it to GGUF at the three formats. */
export async function prepare(steps: number): Promise<Prepared> {
  const dir = `${OUT}llama-100m-${steps}-steps/`;
  const stamp = `${dir}prepared.json`;
  const files = Object.fromEntries(FORMATS.map((f) => [f.ours, `${dir}model-${f.type}.gguf`])) as Record<Format, string>;
  const key = JSON.stringify({ CONFIG, SEED, steps, BATCH, SEQ, LR, TRAIN_SECONDS });
  if (existsSync(stamp)) {
    const saved = JSON.parse(readFileSync(stamp, 'utf8')) as Prepared & { key: string };
    if (saved.key === key && Object.values(files).every((f) => existsSync(f))) {
      log(`  reusing the model trained earlier (${dir})`);
      return { ...saved, files };
    }
  }
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  setBackend(createOrtBackend({ threads: 2 }));
  const model = createModel(CONFIG, { seed: SEED });
  model.tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  const data = fortunesDataset(model.tokenizer);
  const trainer = new LocalTrainer(model, { lr: LR, totalSteps: steps, warmupSteps: Math.min(4, Math.floor(steps / 4)) });
  const rng = new Generator(11);
  let firstLoss = Number.NaN;
  let lastLoss = Number.NaN;
  const started = performance.now();
  let done = 0;
  for (let i = 0; i < steps && (performance.now() - started) / 1000 < TRAIN_SECONDS; i++, done++) {
    const r = trainer.step(textBatch(data.train, rng, BATCH, SEQ));
    if (i === 0) firstLoss = r.loss;
    lastLoss = r.loss;
    if ((i + 1) % 8 === 0 || i + 1 === steps) log(`  step ${i + 1}/${steps}: train loss ${r.loss.toFixed(3)}`);
  }
  const trainSeconds = (performance.now() - started) / 1000;
  model.eval();
  await saveModel(model, `${dir}hf`);
  const state = model.hfStateDict();
  for (const f of FORMATS) {
    await hfToGGUF(files[f.ours], {
      config: configToHF(CONFIG), tokenizer: model.tokenizer.toJSON() as Record<string, unknown>,
      weights: [...state].map(([name, t]) => ({ name, shape: [...t.shape] })), read: (n) => state.get(n)!, type: f.type,
    });
  }
  const prepared: Prepared = {
    files, steps: done, trainSeconds, firstLoss, lastLoss, params: model.numParameters(), float32Bytes: 4 * model.numParameters(),
  };
  writeFileSync(stamp, `${JSON.stringify({ ...prepared, key }, null, 2)}\n`);
  return prepared;
}

/** Runs one variant in its own process (see quant-child.ts). */
function runChild(job: ChildJob): Promise<ChildResult> {
  const script = fileURLToPath(new URL('./quant-child.ts', import.meta.url));
  return runTsChild<ChildResult>(script, job, `${job.engine} on ${job.file} (${job.threads} threads)`);
}

function firstDifference(a: number[], b: number[], n: number): number {
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return -1;
}

export async function benchQuant(threads: number[], quick = false): Promise<Row[]> {
  const llamaAvailable = existsSync(LLAMA_MODULE);
  if (!llamaAvailable) log(`  llama.cpp rows skipped: node-llama-cpp is not installed; install it with \`${LLAMA_INSTALL}\` (~730 MB)`);
  const steps = quick ? QUICK_TRAIN_STEPS : TRAIN_STEPS;
  const p = await prepare(steps);
  const tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  const prompt = tokenizer.encode(PROMPT);
  const heldOutAll = fortunesDataset(tokenizer).heldOut;
  const heldOut = { data: [...heldOutAll.subarray(0, EVAL_SEQ * EVAL_WINDOWS + 1)], seqLen: EVAL_SEQ, windows: EVAL_WINDOWS };
  const model = `Llama ${CONFIG.layers}×${CONFIG.hidden}, ${(p.params / 1e6).toFixed(1)}M, fortunes ${p.steps} steps`;
  const note = `${model} (train loss ${p.firstLoss.toFixed(2)} → ${p.lastLoss.toFixed(2)} in ${p.trainSeconds.toFixed(0)} s; `
    + `a few hundred steps would take ~${Math.round((300 * p.trainSeconds) / p.steps / 60)} min here)`;
  log(`  ${note}; GGUF: ${FORMATS.map((f) => `${f.gguf} ${mb(statSync(p.files[f.ours]).size).toFixed(0)} MB`).join(', ')}`);

  const perStep = p.trainSeconds / p.steps;
  const rows: Row[] = [{
    section: 'quant', case: `training before the export: ${p.steps} steps of ${BATCH}×${SEQ} fortune tokens in ${p.trainSeconds.toFixed(0)} s (ort, 2 threads); `
      + `the issue asks a few hundred (~${Math.round((300 * perStep) / 60)} min at this speed), so this model is barely trained`,
    value: p.lastLoss, unit: 'nats (train loss)', reference: 'first step', referenceValue: p.firstLoss, ratio: p.lastLoss / p.firstLoss,
  }];
  const lastThreads = threads[threads.length - 1];
  /** The whole-step graph's runs by format and threads, and llama.cpp's, for the CPU targets. */
  const graphs: Record<'int8' | 'int4', Record<number, ChildResult>> = { int8: {}, int4: {} };
  const llamaAt: Record<number, Partial<Record<Format, ChildResult>>> = {};
  const ours: Partial<Record<Format, ChildResult>> = {};
  const theirs: Partial<Record<Format, ChildResult>> = {};
  for (const t of threads) {
    const label = `${t} thread${t > 1 ? 's' : ''}`;
    const score = t === lastThreads;
    const base = { threads: t, prompt, tokens: DECODE, rounds: ROUNDS, ...(score ? { heldOut } : {}) };
    const oursAt: Partial<Record<Format, ChildResult>> = {};
    const theirsAt: Partial<Record<Format, ChildResult>> = {};
    for (const f of FORMATS) {
      log(`  ours ${f.ours}, ${label} ...`);
      const o = await runChild({ ...base, engine: 'ours', file: p.files[f.ours], ...(f.ours === 'f32' ? {} : { quantize: f.ours }) });
      oursAt[f.ours] = o;
      let l: ChildResult | undefined;
      if (llamaAvailable) {
        log(`  llama.cpp ${f.gguf}, ${label} ...`);
        l = await runChild({ ...base, engine: 'llama.cpp', file: p.files[f.ours], llamaModule: LLAMA_MODULE });
        theirsAt[f.ours] = l;
      }
      if (score) {
        ours[f.ours] = o;
        if (l) theirs[f.ours] = l;
      }
      const q4 = f.ours === 'int4';
      if (l) {
        rows.push({
          section: 'quant', case: `decode ours ${f.ours} vs llama.cpp ${f.gguf}, ${model}, ${prompt.length}-token prompt, ${label}`,
          value: o.tokensPerSecond, unit: 'tok/s', reference: `llama.cpp ${f.gguf}`, referenceValue: l.tokensPerSecond,
          ratio: o.tokensPerSecond / l.tokensPerSecond,
          ...(q4 ? { target: `≥0.8× (moonshot ≥1×): ${met(o.tokensPerSecond >= 0.8 * l.tokensPerSecond)}` } : {}),
        });
        rows.push({
          section: 'quant', case: `peak RSS (VmHWM, whole process) ours ${f.ours} vs llama.cpp ${f.gguf}, ${label}`,
          value: mb(o.peakRss), unit: 'MiB', reference: `llama.cpp ${f.gguf}`, referenceValue: mb(l.peakRss), ratio: o.peakRss / l.peakRss,
        });
      } else {
        rows.push({
          section: 'quant', case: `decode ours ${f.ours}, ${model}, ${label} (llama.cpp not installed: ${LLAMA_INSTALL})`,
          value: o.tokensPerSecond, unit: 'tok/s', reference: 'llama.cpp (not installed)', referenceValue: Number.NaN, ratio: Number.NaN,
        });
      }
    }
    const wholeStep = await wholeStepRows(rows, label, { ...base, heldOut: undefined }, p.files, oursAt, theirsAt, runChild);
    for (const [f, o] of wholeStep) graphs[f][t] = o;
    if (t > 1) {
      // onnxruntime's 'auto' spinning pool spins for products this small; on a busy 2-core VM a spinning thread
      // fights for the core, so the quantized formats also run with spinning off
      for (const f of FORMATS.filter((x) => x.ours !== 'f32')) {
        log(`  ours ${f.ours}, ${label}, spinning off ...`);
        const o = await runChild({ ...base, heldOut: undefined, engine: 'ours', file: p.files[f.ours], quantize: f.ours as 'int8' | 'int4', spinning: false });
        const l = theirsAt[f.ours];
        const vs = l ? `; ${(o.tokensPerSecond / l.tokensPerSecond).toFixed(2)}× llama.cpp ${f.gguf} (${l.tokensPerSecond.toFixed(1)} tok/s)` : '';
        const f32 = oursAt.f32!;
        rows.push({
          section: 'quant', case: `decode ours ${f.ours} with onnxruntime spinning off vs default spinning ('auto'), ${label}`
            + ` (${(o.tokensPerSecond / f32.tokensPerSecond).toFixed(2)}× ours f32${vs})`,
          value: o.tokensPerSecond, unit: 'tok/s', reference: `ours ${f.ours}, default`, referenceValue: oursAt[f.ours]!.tokensPerSecond,
          ratio: o.tokensPerSecond / oursAt[f.ours]!.tokensPerSecond,
          ...(f.ours === 'int4' && l
            ? { target: `spinning off: ≥0.8× llama.cpp Q4_0: ${met(o.tokensPerSecond >= 0.8 * l.tokensPerSecond)}; `
              + `≥3× f32: ${met(o.tokensPerSecond >= 3 * f32.tokensPerSecond)}` }
            : {}),
        });
      }
    }
    llamaAt[t] = theirsAt;
    const f32 = oursAt.f32!;
    for (const f of ['int8', 'int4'] as const) {
      const o = oursAt[f]!;
      rows.push({
        section: 'quant', case: `decode ours ${f} vs ours f32, ${label}`,
        value: o.tokensPerSecond, unit: 'tok/s', reference: 'ours f32', referenceValue: f32.tokensPerSecond,
        ratio: o.tokensPerSecond / f32.tokensPerSecond,
        ...(f === 'int4' ? { target: `≥3×: ${met(o.tokensPerSecond >= 3 * f32.tokensPerSecond)}` } : {}),
      });
      rows.push({
        section: 'quant', case: `peak RSS (VmHWM, whole process) ours ${f} vs ours f32, ${label}`,
        value: mb(o.peakRss), unit: 'MiB', reference: 'ours f32', referenceValue: mb(f32.peakRss), ratio: o.peakRss / f32.peakRss,
      });
    }
  }

  rows.push(...cpuTargets(threads, graphs, llamaAt));

  // memory held by the weights, against the float32 weights
  for (const f of ['int8', 'int4'] as const) {
    const held = ours[f]!.weightBytes!;
    const bound = f === 'int4' ? 0.2 : 0.3;
    rows.push({
      section: 'quant', case: `weights held, ours ${f} (peak RSS ${mb(ours[f]!.peakRss).toFixed(0)} MiB, f32 ${mb(ours.f32!.peakRss).toFixed(0)} MiB)`,
      value: mb(held), unit: 'MiB', reference: 'float32 weights', referenceValue: mb(p.float32Bytes), ratio: held / p.float32Bytes,
      target: `≤${bound}× float32 weights: ${met(held <= bound * p.float32Bytes)}`,
    });
  }

  // held-out perplexity
  const ppl = (r: ChildResult) => r.heldOut!.perplexity;
  const evalNote = `${ours.f32!.heldOut!.tokens} held-out fortune tokens (${EVAL_WINDOWS} windows of ${EVAL_SEQ})`;
  for (const f of FORMATS) {
    const o = ours[f.ours]!;
    const rel = 100 * (ppl(o) / ppl(ours.f32!) - 1);
    const bound = f.ours === 'int8' ? 1 : f.ours === 'int4' ? 5 : undefined;
    rows.push({
      section: 'quant', case: `perplexity ours ${f.ours} (${rel >= 0 ? '+' : ''}${rel.toFixed(2)}% vs f32), ${evalNote}`,
      value: ppl(o), unit: 'ppl', reference: 'ours f32', referenceValue: ppl(ours.f32!), ratio: ppl(o) / ppl(ours.f32!),
      ...(bound !== undefined ? { target: `≤+${bound}%: ${met(rel <= bound)}` } : {}),
    });
    const l = theirs[f.ours];
    if (l) {
      rows.push({
        section: 'quant', case: `perplexity ours ${f.ours} vs llama.cpp ${f.gguf} (its full next-token probabilities), same tokens`,
        value: ppl(o), unit: 'ppl', reference: `llama.cpp ${f.gguf}`, referenceValue: ppl(l), ratio: ppl(o) / ppl(l),
      });
    }
  }

  // llama.cpp's greedy tokens on our F32 export
  if (theirs.f32) {
    const at = firstDifference(ours.f32!.tokens, theirs.f32.tokens, GREEDY);
    rows.push({
      section: 'quant', case: `greedy tokens, llama.cpp F32 vs ours f32, ${GREEDY} tokens after ${JSON.stringify(PROMPT)}: `
        + `${at < 0 ? 'equal' : `first differs at index ${at}`} (ours says ${JSON.stringify(tokenizer.decode(ours.f32!.tokens.slice(0, GREEDY)))})`,
      value: at < 0 ? GREEDY : at, unit: 'tokens equal', reference: 'ours f32', referenceValue: GREEDY, ratio: (at < 0 ? GREEDY : at) / GREEDY,
      target: `equal: ${met(at < 0)}`,
    });
    for (const f of ['int8', 'int4'] as const) {
      if (!theirs[f]) continue;
      const d = firstDifference(ours[f]!.tokens, theirs[f].tokens, GREEDY);
      rows.push({
        section: 'quant', case: `greedy tokens, llama.cpp ${f === 'int8' ? 'Q8_0' : 'Q4_0'} vs ours ${f} (informative; llama.cpp rounds `
          + `activations to 8 bits): ${d < 0 ? 'equal' : `first differs at index ${d}`}`,
        value: d < 0 ? GREEDY : d, unit: 'tokens equal', reference: `ours ${f}`, referenceValue: GREEDY, ratio: (d < 0 ? GREEDY : d) / GREEDY,
      });
    }
  }
  log(`  ours f32 says: ${JSON.stringify(tokenizer.decode(ours.f32!.tokens))}`);
  log(`  ${note}`);
  return rows;
}
