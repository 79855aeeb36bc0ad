import type { Row } from './gemm.ts';
import type { ChildJob, ChildResult } from './quant-child.ts';

/**
 * The quant section's whole-step rows and the CPU targets of #46: ours at int8 / int4 decoding with the whole step
 * as one onnxruntime graph (graph-decode.ts), against llama.cpp on the same file in the same run and against ours op
 * by op, and the step's int8/int4 products alone (the floor of a graph of MatMulNBits); then each target, met or not:
 * int4 decode ≥ 1.0× llama.cpp Q4_0 on 1 and 2 threads, peak memory (VmHWM) ≤ 1.2× llama.cpp's at int8 and int4, both
 * with whole-step graphs.
 */

type Compact = 'int8' | 'int4';
const GGUF: Record<Compact, string> = { int8: 'Q8_0', int4: 'Q4_0' };
const mb = (bytes: number) => bytes / 2 ** 20;
const met = (ok: boolean) => (ok ? 'met' : 'NOT met');
const threadsLabel = (t: number) => `${t} thread${t > 1 ? 's' : ''}`;

function firstDifference(a: readonly number[], b: readonly number[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return i;
  return -1;
}

/**
 * Runs ours at int8 and int4 with whole-step graphs (`job` with `wholeStep`), adds their rows to `rows`, and
 * returns the results by format.
 */
export async function wholeStepRows(
  rows: Row[],
  label: string,
  job: Omit<ChildJob, 'engine' | 'file'>,
  files: Record<Compact, string>,
  opByOp: Partial<Record<string, ChildResult>>,
  llama: Partial<Record<string, ChildResult>>,
  run: (job: ChildJob) => Promise<ChildResult>,
): Promise<[Compact, ChildResult][]> {
  const out: [Compact, ChildResult][] = [];
  for (const f of ['int8', 'int4'] as const) {
    process.stderr.write(`  ours ${f}, whole-step graph, ${label} ...\n`);
    const o = await run({ ...job, engine: 'ours', file: files[f], quantize: f, wholeStep: true });
    out.push([f, o]);
    const mine = opByOp[f]!;
    const at = firstDifference(o.tokens, mine.tokens);
    const p = o.profile!;
    const detail = `onnxruntime's run ${p.runMs.toFixed(2)} ms + js ${(p.glueMs * 1000).toFixed(0)} µs a token, compiled in ${p.compileSeconds.toFixed(1)} s; `
      + `${(o.tokensPerSecond / mine.tokensPerSecond).toFixed(2)}× ours op by op (${mine.tokensPerSecond.toFixed(1)} tok/s, ${mine.cpuMsPerToken.toFixed(2)} ms CPU); `
      + `greedy tokens ${at < 0 ? 'equal to' : `differ at index ${at} from`} op by op`;
    const l = llama[f];
    const cpu = `CPU time a token ${o.cpuMsPerToken.toFixed(2)} ms${l ? ` against llama.cpp's ${l.cpuMsPerToken.toFixed(2)} ms` : ''}`;
    rows.push({
      section: 'quant', case: `decode ours ${f}, whole-step graph, vs llama.cpp ${GGUF[f]}, ${label} (${detail}; ${cpu})`,
      value: o.tokensPerSecond, unit: 'tok/s', reference: l ? `llama.cpp ${GGUF[f]}` : 'llama.cpp (not installed)',
      referenceValue: l?.tokensPerSecond ?? Number.NaN, ratio: l ? o.tokensPerSecond / l.tokensPerSecond : Number.NaN,
    });
    // the floor of any graph built of MatMulNBits: the step's products alone, against llama.cpp's whole step
    const products = await run({ ...job, engine: 'ours', file: files[f], quantize: f, productsOnly: true });
    rows.push({
      section: 'quant', case: `ours ${f}: the ${products.products} products of a token's step alone (one graph of MatMulNBits, one row), `
        + `vs llama.cpp ${GGUF[f]}'s whole step, ${label} (CPU time a token ${products.cpuMsPerToken.toFixed(2)} ms`
        + `${l ? ` against ${l.cpuMsPerToken.toFixed(2)} ms` : ''})`,
      value: products.tokensPerSecond, unit: 'steps/s', reference: l ? `llama.cpp ${GGUF[f]} tok/s` : 'llama.cpp (not installed)',
      referenceValue: l?.tokensPerSecond ?? Number.NaN, ratio: l ? products.tokensPerSecond / l.tokensPerSecond : Number.NaN,
    });
    rows.push({
      section: 'quant', case: `peak RSS (VmHWM, whole process) ours ${f}, whole-step graph, vs llama.cpp ${GGUF[f]}, ${label} `
        + `(ours op by op: ${mb(mine.peakRss).toFixed(0)} MiB; after load ${mb(o.loadedRss).toFixed(0)} MiB)`,
      value: mb(o.peakRss), unit: 'MiB', reference: l ? `llama.cpp ${GGUF[f]}` : 'llama.cpp (not installed)',
      referenceValue: l ? mb(l.peakRss) : Number.NaN, ratio: l ? o.peakRss / l.peakRss : Number.NaN,
    });
  }
  return out;
}

/**
 * A caveat where llama.cpp's CPU time a token at `t` threads is over twice its time at 1 thread: its pool's threads
 * spin-wait for a core that other work holds, so the figure says more about the machine's load than the engines.
 */
function spinNote(t: number, llama: Record<number, Partial<Record<string, ChildResult>>>): string {
  const one = llama[1]?.int4;
  const at = llama[t]?.int4;
  if (t === 1 || one === undefined || at === undefined || at.cpuMsPerToken <= 2 * one.cpuMsPerToken) return '';
  return `; llama.cpp spent ${(at.cpuMsPerToken / one.cpuMsPerToken).toFixed(1)}× its 1-thread CPU time a token: its threads spin-wait `
    + 'for a core that other work holds, so this ratio measures the machine\'s load more than the engines';
}

/** The CPU targets of #46, each met or not (NOT met where llama.cpp did not run). */
export function cpuTargets(
  threads: readonly number[],
  graphs: Record<Compact, Record<number, ChildResult>>,
  llama: Record<number, Partial<Record<string, ChildResult>>>,
): Row[] {
  const rows: Row[] = [];
  for (const t of [1, 2]) {
    const o = graphs.int4[t];
    const l = llama[t]?.int4;
    const why = o === undefined
      ? ' (not measured: the bench ran other thread counts)'
      : l === undefined
        ? ' (llama.cpp not installed)'
        : ` (CPU time a token: ${o.cpuMsPerToken.toFixed(2)} ms against ${l.cpuMsPerToken.toFixed(2)} ms, ${(l.cpuMsPerToken / o.cpuMsPerToken).toFixed(2)}×${spinNote(t, llama)})`;
    rows.push({
      section: 'quant', case: `CPU target (#46): int4 decode with whole-step graphs ≥ 1.0× llama.cpp Q4_0, ${threadsLabel(t)}${why}`,
      value: o?.tokensPerSecond ?? Number.NaN, unit: 'tok/s', reference: 'llama.cpp Q4_0', referenceValue: l?.tokensPerSecond ?? Number.NaN,
      ratio: o && l ? o.tokensPerSecond / l.tokensPerSecond : Number.NaN,
      // where llama.cpp's threads spun for a busy core, its figure says more about the machine's load: not judged
      target: spinNote(t, llama) !== ''
        ? '≥1.0×: not judged (llama.cpp spin-waited on a loaded machine)'
        : `≥1.0×: ${met(o !== undefined && l !== undefined && o.tokensPerSecond >= l.tokensPerSecond)}`,
    });
  }
  for (const f of ['int4', 'int8'] as const) {
    // the worst ratio over the thread counts measured
    let worst: { t: number; o: ChildResult; l: ChildResult } | undefined;
    for (const t of threads) {
      const o = graphs[f][t];
      const l = llama[t]?.[f];
      if (o && l && (worst === undefined || o.peakRss / l.peakRss > worst.o.peakRss / worst.l.peakRss)) worst = { t, o, l };
    }
    rows.push({
      section: 'quant', case: `CPU target (#46): peak memory (VmHWM) of ours ${f} with whole-step graphs ≤ 1.2× llama.cpp ${GGUF[f]}'s`
        + `${worst ? ` (the worst of ${threads.map(threadsLabel).join(', ')}: ${threadsLabel(worst.t)})` : ' (llama.cpp not installed)'}`,
      value: worst ? mb(worst.o.peakRss) : Number.NaN, unit: 'MiB', reference: `llama.cpp ${GGUF[f]}`,
      referenceValue: worst ? mb(worst.l.peakRss) : Number.NaN, ratio: worst ? worst.o.peakRss / worst.l.peakRss : Number.NaN,
      target: `≤1.2×: ${met(worst !== undefined && worst.o.peakRss <= 1.2 * worst.l.peakRss)}`,
    });
  }
  return rows;
}
