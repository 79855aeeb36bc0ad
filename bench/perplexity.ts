import { existsSync, mkdirSync, statSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { SWIFTSHADER } from '../src/tensor/backends/webgpu/runtime.ts';
import type { Row } from './gemm.ts';
import type { Engine, PerplexityJob, PerplexityResult } from './perplexity-child.ts';
import { CONFIG, type Format, FORMATS, PROMPT, type TrainedModel, trainedModel } from './perplexity-model.ts';
import { runTsChild } from './child-json.ts';

/**
 * The compact formats' accuracy on a model that has learned something: the small Llama of perplexity-model.ts, trained
 * on fortunes until its greedy text is words, exported to GGUF at F32, BF16, Q8_0 and Q4_0; held-out perplexity of each
 * file at its format (ours: f32, bf16, int8, int4 as the file holds them) on the js, ort and webgpu backends and on
 * llama.cpp (node-llama-cpp), each in its own process (perplexity-child.ts), every figure against f32 on the same
 * engine. Targets (#46): int8 within +1%, int4 within +5% of f32.
 *
 * webgpu runs on SwiftShader where the machine names no Vulkan driver (~500× slower than the CPU), so it scores only
 * the first SLICE windows; every engine scores that slice too (like for like), and ort and llama.cpp also the whole
 * held-out set (js does not: see FULL). Prints a format × engine table and writes it to bench/out/perplexity.json.
 */

/** Windows of SEQ held-out bytes; the slice every engine scores is the first SLICE of them (a multiple of the child's BATCH). */
const SEQ = 128;
const SLICE = 8;
/** One CPU thread for every engine: the figures are accuracies, not speeds, and a spinning pool of 2 on a shared 2-core VM crawls. */
const THREADS = 1;
const ENGINES: readonly Engine[] = ['js', 'ort', 'webgpu', 'llama.cpp'];
/**
 * Engines that also score the whole held-out set: not webgpu (see above), nor js, whose compact kernels unpack a row at
 * a time and sum in double precision (exact, for a validator's re-run: quant/kernels.ts), ~30× slower than its float32
 * GEMM: ~18 s a batch of 4 × 128 here, so the 1,041 windows would take over an hour per format.
 */
const FULL: ReadonlySet<Engine> = new Set(['ort', 'llama.cpp']);
const BOUND: Partial<Record<Format, number>> = { int8: 1, int4: 5 };

const LLAMA_MODULE = fileURLToPath(new URL('./llama-cpp/node_modules/node-llama-cpp/dist/index.js', import.meta.url));
const LLAMA_INSTALL = 'npm ci --prefix bench/llama-cpp';
const JSON_OUT = fileURLToPath(new URL('./out/perplexity.json', import.meta.url));

const log = (s: string) => process.stderr.write(`${s}\n`);
const met = (ok: boolean) => (ok ? 'met' : 'NOT met');
const pct = (r: number) => `${r >= 1 ? '+' : ''}${(100 * (r - 1)).toFixed(2)}%`;
const label = (e: Engine, f: Format) => (e === 'llama.cpp' ? `llama.cpp ${FORMATS.find((x) => x.ours === f)!.gguf}` : `${e} ${f}`);

/** The environment of a child: webgpu gets SwiftShader where no Vulkan driver is named (as scripts/test.mjs does). */
function childEnv(engine: Engine): { env: NodeJS.ProcessEnv; adapter: string } {
  const env = { ...process.env };
  if (engine !== 'webgpu') return { env, adapter: '' };
  if (env.VK_ICD_FILENAMES === undefined && existsSync(SWIFTSHADER.icd)) {
    env.VK_ICD_FILENAMES = SWIFTSHADER.icd;
    env.LD_LIBRARY_PATH = [env.LD_LIBRARY_PATH, SWIFTSHADER.lib].filter(Boolean).join(':');
    return { env, adapter: 'SwiftShader, software Vulkan' };
  }
  return { env, adapter: `VK_ICD_FILENAMES=${env.VK_ICD_FILENAMES ?? '(unset)'}` };
}

function runChild(job: PerplexityJob): Promise<PerplexityResult> {
  const script = fileURLToPath(new URL('./perplexity-child.ts', import.meta.url));
  return runTsChild<PerplexityResult>(script, job, label(job.engine, job.format), childEnv(job.engine).env);
}

type Results = Partial<Record<Engine, Partial<Record<Format, PerplexityResult>>>>;

/** The format × engine table, on one set ('slice' or 'full'): perplexity and ratio to f32 on the same engine. */
function table(results: Results, set: 'slice' | 'full'): string[] {
  const engines = ENGINES.filter((e) => FORMATS.some((f) => results[e]?.[f.ours]?.[set]));
  if (engines.length === 0) return [];
  const cell = (e: Engine, f: Format) => {
    const r = results[e]?.[f]?.[set];
    const base = results[e]?.f32?.[set];
    if (!r) return 'n/a';
    return f === 'f32' || !base ? r.perplexity.toFixed(4) : `${r.perplexity.toFixed(4)} (${pct(r.perplexity / base.perplexity)})`;
  };
  const head = ['format', ...engines];
  const rows = FORMATS.map((f) => [f.ours, ...engines.map((e) => cell(e, f.ours))]);
  const width = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(width[i])).join(' | ');
  return [line(head), width.map((w) => '-'.repeat(w)).join('-|-'), ...rows.map(line)];
}

function trainingRows(m: TrainedModel): Row[] {
  const model = `Llama ${CONFIG.layers}×${CONFIG.hidden} (${(m.params / 1e6).toFixed(2)}M parameters, not the quant section's ~100M: see perplexity-model.ts)`;
  const stages = (m.stages ?? []).map((s) => `${s.steps} of batch ${s.batch} at lr ${s.lr} in ${s.seconds.toFixed(0)} s`).join(', then ');
  return [{
    section: 'perplexity',
    case: `training: ${model}, ${m.steps} steps (${stages}) of ${m.seq}-byte fortune windows in ${m.trainSeconds.toFixed(0)} s, made `
      + `(with the checks, the samples and the GGUF exports) in ${m.makeSeconds.toFixed(0)} s, finished ${m.made}; `
      + `train loss ${m.firstLoss.toFixed(2)} → ${m.lastLoss.toFixed(2)} (mean of the last 50 steps), `
      + `held-out perplexity ${m.heldOut.perplexity.toFixed(3)} (f32, the first ${m.heldOut.tokens} held-out bytes)`,
    value: m.lastLoss, unit: 'nats (train loss)', reference: 'first step', referenceValue: m.firstLoss, ratio: m.lastLoss / m.firstLoss,
  }, {
    section: 'perplexity',
    case: `greedy after ${JSON.stringify(PROMPT)}: ${JSON.stringify(m.sample)}; share of its words (2+ letters) found in the training text`,
    value: 100 * m.wordShare, unit: '%', reference: 'all words', referenceValue: 100, ratio: m.wordShare,
    target: `words (≥80%): ${met(m.wordShare >= 0.8)}`,
  }];
}

export async function benchPerplexity(quick = false): Promise<Row[]> {
  const m = await trainedModel();
  log(`  Llama ${CONFIG.layers}×${CONFIG.hidden}, ${m.steps} steps (${m.trainSeconds.toFixed(0)} s to train, ${m.makeSeconds.toFixed(0)} s to make), `
    + `held-out perplexity ${m.heldOut.perplexity.toFixed(3)} on ${m.heldOut.tokens} bytes; greedy: ${JSON.stringify(m.sample)}`);
  log(`  GGUF: ${FORMATS.map((f) => `${f.gguf} ${(statSync(m.files[f.ours]).size / 2 ** 20).toFixed(1)} MiB`).join(', ')}`);
  const llama = existsSync(LLAMA_MODULE);
  if (!llama) log(`  llama.cpp skipped: node-llama-cpp is not installed (\`${LLAMA_INSTALL}\`)`);
  const rows = trainingRows(m);
  const results: Results = {};
  const seconds: Record<string, number> = {};
  const failed: string[] = [];
  for (const engine of ENGINES) {
    if (engine === 'llama.cpp' && !llama) continue;
    for (const f of FORMATS) {
      const full = !quick && FULL.has(engine);
      log(`  ${label(engine, f.ours)}: ${full ? 'the whole held-out set and ' : ''}the first ${SLICE} windows ...`);
      try {
        const r = await runChild({
          engine, file: m.files[f.ours], format: f.ours, seqLen: SEQ, slice: SLICE, full, threads: THREADS,
          ...(engine === 'llama.cpp' ? { llamaModule: LLAMA_MODULE } : {}),
        });
        (results[engine] ??= {})[f.ours] = r;
        seconds[label(engine, f.ours)] = r.seconds;
        log(`    ${r.full ? `full ${r.full.perplexity.toFixed(4)} (${r.full.tokens} bytes), ` : ''}slice ${r.slice.perplexity.toFixed(4)} in ${r.seconds.toFixed(0)} s`);
      } catch (err) {
        failed.push((err as Error).message);
        log(`    failed: ${(err as Error).message}`);
      }
    }
  }

  const adapter = childEnv('webgpu').adapter;
  for (const set of ['full', 'slice'] as const) {
    for (const engine of ENGINES) {
      const base = results[engine]?.f32?.[set];
      if (!base) continue;
      const where = set === 'full'
        ? `the whole held-out set (${base.tokens} bytes)`
        : `the first ${SLICE} windows of ${SEQ} (${base.tokens} bytes)${engine === 'webgpu' && adapter ? `, on ${adapter}` : ''}`;
      for (const f of FORMATS) {
        const r = results[engine]?.[f.ours]?.[set];
        if (!r) continue;
        const ratio = r.perplexity / base.perplexity;
        const bound = BOUND[f.ours];
        rows.push({
          section: 'perplexity', case: `held-out perplexity ${label(engine, f.ours)} (${pct(ratio)}), ${where}`,
          value: r.perplexity, unit: 'ppl', reference: label(engine, 'f32'), referenceValue: base.perplexity, ratio,
          ...(bound !== undefined ? { target: `≤+${bound}%: ${met(ratio <= 1 + bound / 100)}` } : {}),
        });
      }
    }
  }
  // the engines against each other at f32, on the slice (informative: one file, four implementations)
  const js = results.js?.f32?.slice;
  for (const engine of ENGINES.filter((e) => e !== 'js')) {
    const r = results[engine]?.f32?.slice;
    if (!js || !r) continue;
    rows.push({
      section: 'perplexity', case: `held-out perplexity at f32, ${engine} vs js, the first ${SLICE} windows (informative)`,
      value: r.perplexity, unit: 'ppl', reference: 'js f32', referenceValue: js.perplexity, ratio: r.perplexity / js.perplexity,
    });
  }

  for (const set of ['full', 'slice'] as const) {
    const lines = table(results, set);
    if (lines.length > 0) {
      log(`\n  held-out perplexity, ${set === 'full' ? 'the whole held-out set' : `the first ${SLICE} windows of ${SEQ} bytes`} (vs f32 on the same engine):`);
      for (const l of lines) log(`  ${l}`);
    }
  }
  for (const f of failed) log(`  failed: ${f}`);
  mkdirSync(fileURLToPath(new URL('./out/', import.meta.url)), { recursive: true });
  writeFileSync(JSON_OUT, `${JSON.stringify({
    date: new Date().toISOString(), model: { config: CONFIG, ...m }, seqLen: SEQ, slice: SLICE, threads: THREADS, webgpuAdapter: adapter,
    targets: { int8: '≤ +1% of f32', int4: '≤ +5% of f32' }, results, seconds, failed, rows,
  }, null, 2)}\n`);
  log(`  JSON: ${JSON_OUT}`);
  return rows;
}
