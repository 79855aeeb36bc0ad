/**
 * Where a decoded token's time goes (issue #30): builds the quant bench's Llama (16 blocks 768 wide, 12 heads, 4 KV
 * heads, SwiGLU 2048, byte vocabulary: 100.9M parameters; seeded, untrained), optionally holds its matrices in int8 /
 * int4, and decodes greedily with a KV cache:
 *   node --import tsx bench/decode-profile.ts [--format f32|int8|int4] [--backend ort|js] [--threads 1]
 *     [--prompt 45] [--tokens 48] [--rounds 3] [--split [--modules]] [--profile FILE] [--json]
 * It prints the decode speed (tokens after the first, best round). With --split it times one more round with every
 * backend kernel and each layer of the model wrapped (exclusive times: a call's own work without its children's;
 * with --modules each module too, which turns the one-token block step off), so the table says what a step spends
 * on the products with the weights, attention, and the rest (norms, rotary, the cache, js between the native calls).
 * --profile FILE records the last round with V8's sampling profiler and prints its self time by function; a saved
 * .cpuprofile (from `node --cpu-prof` too) is summarised with:
 *   node --import tsx bench/decode-profile.ts --summarise FILE.cpuprofile
 */
import '../src/polyfills.ts';
import { readFileSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { parseArgs } from 'node:util';
import { compactWeight, createModel, type CausalLM, KVCache, llamaConfig } from '../src/models/index.ts';
import { type Backend, createOrtBackend, jsBackend, noGrad, packWeight, setBackend, tensor } from '../src/tensor/index.ts';

const CONFIG = llamaConfig({
  vocabSize: 257, hidden: 768, heads: 12, kvHeads: 4, layers: 16, intermediate: 2048, maxPositions: 512,
  tieWordEmbeddings: true, bosTokenId: 256, eosTokenId: 256,
});
const SEED = 7;

/** Exclusive wall time by label: a wrapped call's time less that of the wrapped calls inside it. */
class Split {
  readonly ms = new Map<string, number>();
  readonly calls = new Map<string, number>();
  private readonly stack: number[] = [];

  time<T>(label: string, fn: () => T): T {
    this.stack.push(0);
    const t0 = performance.now();
    try {
      return fn();
    } finally {
      const total = performance.now() - t0;
      const children = this.stack.pop()!;
      if (this.stack.length > 0) this.stack[this.stack.length - 1] += total;
      this.ms.set(label, (this.ms.get(label) ?? 0) + total - children);
      this.calls.set(label, (this.calls.get(label) ?? 0) + 1);
    }
  }

  reset(): void {
    this.ms.clear();
    this.calls.clear();
  }
}

/** The backend with each kernel timed under its kind (products with a weight, attention's batched products, ...). */
function timedBackend(inner: Backend, split: Split): Backend {
  const b: Backend = {
    name: inner.name,
    deterministic: inner.deterministic,
    matmul: (a, w, out, spec, bias) => {
      const label = spec.batchedB && spec.batch > 1 ? 'kernel: batched matmul (attention)' : `kernel: matmul ${spec.m}x${spec.k}x${spec.n}`;
      split.time(label, () => inner.matmul(a, w, out, spec, bias));
    },
  };
  if (inner.packedLinear) {
    const f = inner.packedLinear.bind(inner);
    b.packedLinear = (x, m, w, y) => split.time(`kernel: packed ${w.format} ${m}x${w.cols}x${w.rows}`, () => f(x, m, w, y));
  }
  if (inner.linears) {
    const f = inner.linears.bind(inner);
    b.linears = (x, m, ws, ys) => split.time(`kernel: fused linears ${ws.map((w) => `${w.packed?.format ?? 'f32'} ${w.rows}`).join('+')}`, () => f(x, m, ws, ys));
  }
  if (inner.gatedMlp) {
    const f = inner.gatedMlp.bind(inner);
    b.gatedMlp = (x, m, g, u, d, y) => split.time(`kernel: fused gated MLP ${g.packed?.format ?? 'f32'} ${g.cols}x${g.rows}`, () => f(x, m, g, u, d, y));
  }
  for (const key of ['unary', 'unaryBackward', 'softmax', 'layerNorm', 'attention'] as const) {
    const f = inner[key] as ((...args: unknown[]) => boolean) | undefined;
    if (f) (b as unknown as Record<string, unknown>)[key] = (...args: unknown[]) => split.time(`kernel: ${key}`, () => f.apply(inner, args));
  }
  return b;
}

/**
 * Wraps the model's layers and, with `modules`, every module's forward but Linear's (labelled by its class). A forward
 * set on a module turns off what stands for it (the fused products for a Linear, the one-token step of a block for
 * its norms: llama.ts, decode-step.ts), so with `modules` the split is the generic block's.
 */
function timeModules(model: CausalLM, split: Split, modules: boolean): void {
  for (const [, m] of modules ? model.namedModules() : []) {
    if (m === model || m.constructor.name === 'Linear' || typeof (m as { forward?: unknown }).forward !== 'function') continue;
    const label = `module: ${m.constructor.name}`;
    const forward = (m as unknown as { forward: (...args: unknown[]) => unknown }).forward.bind(m);
    (m as unknown as { forward: unknown }).forward = (...args: unknown[]) => split.time(label, () => forward(...args));
  }
  for (const layer of model.layers) {
    const forward = layer.forward.bind(layer);
    (layer as { forward: typeof forward }).forward = (x, ctx) => split.time(`layer: ${layer.kind}`, () => forward(x, ctx));
  }
}

function buildModel(format: string): CausalLM {
  const model = createModel(CONFIG, { seed: SEED });
  if (format !== 'f32') {
    noGrad(() => {
      for (const [name, t] of model.hfStateDict()) if (compactWeight(name, t.shape)) packWeight(t, format as 'int8' | 'int4');
    });
  }
  return model;
}

/** Greedy decode: the prompt's pass, then one token a step; returns the tokens, the prompt's and the decode's seconds. */
function decode(
  model: CausalLM, prompt: number[], tokens: number, step?: (i: number) => void,
): { tokens: number[]; promptSeconds: number; seconds: number } {
  const cache = new KVCache(model.config.layers);
  const next = (ids: number[]) =>
    noGrad(() => {
      const logits = model.forward(tensor(Int32Array.from(ids), [1, ids.length], 'int32'), { cache });
      const v = logits.shape[2];
      const last = logits.data.subarray((ids.length - 1) * v, ids.length * v);
      let best = 0;
      for (let i = 1; i < v; i++) if (last[i] > last[best]) best = i;
      return best;
    });
  const t0 = performance.now();
  const out = [next(prompt)];
  const t = performance.now();
  while (out.length < tokens) {
    step?.(out.length);
    out.push(next([out[out.length - 1]]));
  }
  return { tokens: out, promptSeconds: (t - t0) / 1000, seconds: (performance.now() - t) / 1000 };
}

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

/** Self time by function (name, file:line) of a V8 .cpuprofile, largest first. */
function summarise(file: string, top = 40): void {
  const p = JSON.parse(readFileSync(file, 'utf8')) as { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] };
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const self = new Map<string, number>();
  let total = 0;
  for (let i = 0; i < p.samples.length; i++) {
    const n = byId.get(p.samples[i])!;
    const { functionName, url, lineNumber } = n.callFrame;
    const key = `${functionName || '(anonymous)'} ${url.replace(/^.*\/(src|bench|node_modules)\//, '$1/')}:${lineNumber + 1}`;
    const dt = (p.timeDeltas[i] ?? 0) / 1000;
    self.set(key, (self.get(key) ?? 0) + dt);
    total += dt;
  }
  const rows = [...self].sort((a, b) => b[1] - a[1]).slice(0, top);
  console.log(`total sampled ${total.toFixed(0)} ms`);
  for (const [k, ms] of rows) console.log(`${ms.toFixed(1).padStart(9)} ms ${((100 * ms) / total).toFixed(1).padStart(5)}%  ${k}`);
}

/** Runs fn under V8's sampling profiler, writes the .cpuprofile to `file` and prints its summary. */
function profiled<T>(file: string, fn: () => T): T {
  const session = new Session();
  session.connect();
  const post = (method: string, params?: object) => {
    let result: unknown;
    session.post(method, params ?? {}, (err, r) => {
      if (err) throw err;
      result = r;
    });
    return result as { profile?: object };
  };
  post('Profiler.enable');
  post('Profiler.setSamplingInterval', { interval: 100 });
  post('Profiler.start');
  const out = fn();
  const { profile } = post('Profiler.stop');
  session.disconnect();
  writeFileSync(file, JSON.stringify(profile));
  summarise(file, 30);
  return out;
}

function printSplit(split: Split, steps: number, stepMs: number): void {
  const rows = [...split.ms].sort((a, b) => b[1] - a[1]);
  const timed = rows.reduce((s, [, ms]) => s + ms, 0);
  console.log(`split over ${steps} decode steps (ms per step; exclusive; wrapped step ${stepMs.toFixed(2)} ms):`);
  for (const [label, ms] of rows) {
    const calls = split.calls.get(label)! / steps;
    console.log(`${(ms / steps).toFixed(3).padStart(9)} ms ${((100 * ms) / timed).toFixed(1).padStart(5)}%  ${label}  (${calls.toFixed(0)} calls/step)`);
  }
}

function main(): void {
  const { values } = parseArgs({
    options: {
      format: { type: 'string', default: 'f32' },
      backend: { type: 'string', default: 'ort' },
      threads: { type: 'string', default: '1' },
      prompt: { type: 'string', default: '45' },
      tokens: { type: 'string', default: '48' },
      rounds: { type: 'string', default: '3' },
      split: { type: 'boolean', default: false },
      modules: { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
      summarise: { type: 'string' },
      profile: { type: 'string' },
    },
  });
  if (values.summarise) return summarise(values.summarise);
  const format = values.format!;
  const inner = values.backend === 'js' ? jsBackend : createOrtBackend({ threads: Number(values.threads) });
  setBackend(inner);
  const t0 = performance.now();
  const model = buildModel(format);
  const buildSeconds = (performance.now() - t0) / 1000;
  const prompt = Array.from({ length: Number(values.prompt) }, (_, i) => (i * 37 + 11) % 256);
  const tokens = Number(values.tokens);
  let best = Infinity;
  let promptSeconds = Infinity;
  let out: number[] = [];
  for (let r = 0; r < Number(values.rounds); r++) {
    const profile = values.profile && r === Number(values.rounds) - 1 ? values.profile : null;
    const run = profile ? profiled(profile, () => decode(model, prompt, tokens)) : decode(model, prompt, tokens);
    best = Math.min(best, run.seconds);
    promptSeconds = Math.min(promptSeconds, run.promptSeconds);
    out = run.tokens;
  }
  const tokensPerSecond = (tokens - 1) / best;
  const threads = Number(values.threads);
  const hwm = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync('/proc/self/status', 'utf8'));
  const peakRss = hwm ? Number(hwm[1]) * 1024 : Number.NaN;
  const msPerToken = 1000 / tokensPerSecond;
  const result = { format, backend: inner.name, threads, tokensPerSecond, msPerToken, promptSeconds, buildSeconds, peakRss, tokens: out };
  if (values.json) console.log(JSON.stringify(result));
  else console.log(`${format} ${inner.name} ${values.threads} thread(s): ${tokensPerSecond.toFixed(1)} tok/s (${(1000 / tokensPerSecond).toFixed(2)} ms/token), greedy ${out.slice(0, 12).join(' ')}`);
  if (values.split) {
    const split = new Split();
    setBackend(timedBackend(inner, split));
    timeModules(model, split, values.modules === true);
    let stepStart = 0;
    let steps = 0;
    let stepMs = 0;
    decode(model, prompt, tokens, (i) => {
      if (i === 1) split.reset();
      else if (i > 1) {
        stepMs += performance.now() - stepStart;
        steps++;
      }
      stepStart = performance.now();
    });
    printSplit(split, tokens - 1, stepMs / Math.max(1, steps));
  }
}

main();
