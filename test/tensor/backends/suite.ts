/**
 * The conformance suite every compute backend passes (after libp2p's interface compliance tests: one suite, run by
 * every transport). A backend is done when it passes: every op of the engine (cases.ts) forward and backward, in every
 * format of weights, and one block of each model family (test/fixtures/hf/<family>/), each against the js backend's
 * kernels within the tolerance the backend states; a deterministic backend also gives the same bits on every run.
 * Its last test checks that each kernel the backend has took work (the large cases crossed its thresholds).
 *   conformance('ort', { tolerance: ORT_TOLERANCES })   // one file per backend: js.test.ts, ort.test.ts
 */
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { type CausalLM, KVCache, loadModel } from '../../../src/models/index.ts';
import {
  type Backend,
  type BackendName,
  createOrtBackend,
  Generator,
  jsBackend,
  noGrad,
  randn,
  type Tensor,
  withBackend,
} from '../../../src/tensor/index.ts';
import { ORT_MIN_MACS } from '../../../src/tensor/backends/ort.ts';
import type { MatmulSpec } from '../../../src/tensor/kernels/matmul.ts';
import { type ComputeFormat, drift } from '../../../src/verify/index.ts';
import { HF_FIXTURES, hfFixtureNames } from '../../helpers/hf-fixtures.ts';
import { CASES, type ConformanceCase } from './cases.ts';

export interface ConformanceOptions {
  /**
   * The largest relative L2 distance (`drift`, src/verify/compare.ts) of each result from js's, by the format of the
   * weights it was computed with; 0 where the backend must give js's bits.
   */
  tolerance: Readonly<Record<ComputeFormat, number>>;
  /** Another configuration of the backend to test than the one its name selects, under this label (see `create`). */
  variant?: { label: string; create: () => Backend };
}

/** js must give its own bits: the reference is itself. */
export const BITWISE: Readonly<Record<ComputeFormat, number>> = { f32: 0, bf16: 0, int8: 0, int4: 0 };

/**
 * The backend under test, by name (what setBackend(name) selects, as a fresh instance). When backends have a registry
 * (registerBackend(name, factory)), this is its lookup: the one line to change.
 */
const open = (name: BackendName): Backend => (name === 'js' ? jsBackend : createOrtBackend());

/** The seed of every case's inputs. */
const SEED = 45;

/** One result of a case: an output or a gradient, labelled. */
export interface Result {
  label: string;
  values: Tensor['data'];
}

/** The case's inputs, drawn from the suite's seed: the same bits on every call. */
export function inputsOf(c: ConformanceCase): Tensor[] {
  return c.inputs(new Generator(SEED));
}

/** Fresh float leaves take gradients (compact weights are frozen); float64 where asked, for a reference on js. */
function prepare(xs: Tensor[], dtype: 'float32' | 'float64', grad: boolean): Tensor[] {
  return xs.map((x) => {
    if (x.dtype === 'int32' || x.packed !== null) return x;
    const t = x.to(dtype);
    if (grad) t.requiresGrad = true;
    return t;
  });
}

/**
 * Runs a case on `backend`: its outputs, then, where they carry a graph, the gradient of Σᵢ outputᵢ · wᵢ (w seeded
 * normal weights) to every input that takes one.
 * @example
 * evaluate(jsBackend, CASES[0]) // [{ label: 'output 0', values }, { label: 'gradient of input 0', values }]
 */
export function evaluate(backend: Backend, c: ConformanceCase, dtype: 'float32' | 'float64' = 'float32'): Result[] {
  return withBackend(backend, () => {
    const inputs = prepare(inputsOf(c), dtype, c.noGrad !== true);
    const ran = c.noGrad === true ? noGrad(() => c.run(...inputs)) : c.run(...inputs);
    const outputs = Array.isArray(ran) ? ran : [ran];
    const results: Result[] = outputs.map((o, i) => ({ label: `output ${i}`, values: o.data }));
    const graded = outputs.filter((o) => o.requiresGrad);
    if (graded.length === 0) return results;
    const loss = graded.map((o, i) => o.mul(randn(o.shape, { seed: 1000 + i, dtype })).sum()).reduce((a, b) => a.add(b));
    loss.backward();
    inputs.forEach((x, i) => {
      if (x.grad) results.push({ label: `gradient of input ${i}`, values: x.grad.data });
    });
    return results;
  });
}

/** The same bytes (the same typed array), so NaN payloads and the sign of zero count. */
function sameBits(a: Tensor['data'], b: Tensor['data']): boolean {
  if (a.constructor !== b.constructor || a.length !== b.length) return false;
  const x = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const y = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  return x.every((v, i) => v === y[i]);
}

/**
 * Asserts that `got` holds the results of `ref` (the same labels) within `tolerance` (relative L2 distance from the
 * reference; 0: the same bits; int32 results always exactly). With `bases` (the inputs of a block computed with int8
 * or int4 weights, each under the label of its output), those results' distances are of what the block added to its
 * input, as src/verify/compare.ts measures them. Returns the largest distance.
 */
export function assertAgree(what: string, ref: Result[], got: Result[], tolerance: number, bases: Result[] = []): number {
  assert.deepEqual(got.map((r) => r.label), ref.map((r) => r.label), `${what}: the same outputs and gradients`);
  let worst = 0;
  ref.forEach((r, i) => {
    const g = got[i].values;
    const label = `${what}, ${r.label}`;
    if (tolerance === 0 || r.values instanceof Int32Array) {
      assert.ok(sameBits(r.values, g), `${label}: not the reference's bits`);
      return;
    }
    const withBase = bases.find((b) => b.label === r.label)?.values as Float32Array | undefined;
    const d = drift(r.values as Float32Array, g as Float32Array, withBase);
    assert.ok(d <= tolerance, `${label}: ${d.toExponential(2)} from the reference (tolerance ${tolerance})`);
    worst = Math.max(worst, d);
  });
  return worst;
}

/** Kernels a backend may have besides matmul (Backend in src/tensor/backends/backend.ts). */
const HOOKS = ['packedLinear', 'unary', 'unaryBackward', 'softmax', 'layerNorm', 'attention', 'linears', 'gatedMlp'] as const;
type Hook = (typeof HOOKS)[number];

/** A backend that notes which kernels took work (returned true) and the sizes of the products it ran. */
interface Watched {
  backend: Backend;
  taken: Set<Hook>;
  macs: number[];
}

/**
 * `backend` with its work noted: an object whose prototype is `backend` (so it has what `backend` has, and exactly the
 * kernels it has: ops test for them), with matmul and each kernel of HOOKS noting their work before they return.
 */
function watched(backend: Backend): Watched {
  const taken = new Set<Hook>();
  const macs: number[] = [];
  const wrapped = Object.create(backend) as Record<string, unknown>;
  wrapped.matmul = (a: Float32Array, b: Float32Array, out: Float32Array, spec: MatmulSpec, bias?: Float32Array) => {
    macs.push(spec.batch * spec.m * spec.k * spec.n);
    backend.matmul(a, b, out, spec, bias);
  };
  for (const hook of HOOKS) {
    const kernel = backend[hook] as ((...args: unknown[]) => boolean) | undefined;
    if (kernel === undefined) continue;
    wrapped[hook] = (...args: unknown[]) => {
      const done = kernel.apply(backend, args);
      if (done) taken.add(hook);
      return done;
    };
  }
  return { backend: wrapped as unknown as Backend, taken, macs };
}

/** Rows [2, 32] of hidden states: 64 rows through a 64-wide block's products (262k MACs), 2·4·32·32 = 8192 scores. */
const BLOCK_INPUT = [2, 32] as const;

/** [fixture, the format its weights are held in]: each family in float32; Llama also in each compact format. */
const BLOCKS: [string, ComputeFormat][] = [
  ...hfFixtureNames().map((name): [string, ComputeFormat] => [name, 'f32']),
  ['llama', 'bf16'],
  ['llama', 'int8'],
  ['llama', 'int4'],
];

const loadOptions = (format: ComputeFormat) => (format === 'f32' ? {} : format === 'bf16' ? { dtype: 'bf16' as const } : { quantize: format });

/** A block's results, and its inputs under the labels of the outputs they gave (what int8 and int4 are compared on). */
interface BlockRun {
  results: Result[];
  inputs: Result[];
}

/** One block's forward and backward: its output, its input's gradient, each parameter's gradient by name. */
function trainBlock(backend: Backend, block: CausalLM): BlockRun {
  return withBackend(backend, () => {
    const params = [...block.hfStateDict()];
    for (const [, p] of params) p.grad = null;
    const x = randn([...BLOCK_INPUT, block.config.hidden], { generator: new Generator(SEED) });
    x.requiresGrad = true;
    const y = block.forward(x);
    y.mul(randn(y.shape, { seed: 1000 })).sum().backward();
    const results: Result[] = [{ label: 'output', values: y.data }, { label: 'gradient of the input', values: x.grad!.data }];
    for (const [name, p] of params) if (p.grad) results.push({ label: `gradient of ${name}`, values: p.grad.data });
    return { results, inputs: [{ label: 'output', values: x.data }] };
  });
}

/** Decoding steps after a prompt of 24 (2·4·24·24·16 = 73k MACs of attention over the cache). */
const PROMPT = 24;
const STEPS = 3;

/**
 * One block as decoding runs it, with a KV cache and no gradients: a prompt's hidden states, then one token at a time
 * (attention over the cache time-major; Llama-like blocks take the fused decoding step where the backend has one).
 */
function decodeBlock(backend: Backend, block: CausalLM): BlockRun {
  return withBackend(backend, () => noGrad(() => {
    const g = new Generator(SEED);
    const cache = new KVCache(block.config.layers);
    const run: BlockRun = { results: [], inputs: [] };
    for (let step = 0; step <= STEPS; step++) {
      const label = step === 0 ? 'the prompt\'s output' : `step ${step}'s output`;
      const x = randn([1, step === 0 ? PROMPT : 1, block.config.hidden], { generator: g });
      run.results.push({ label, values: block.forward(x, { cache }).data });
      run.inputs.push({ label, values: x.data });
    }
    return run;
  }));
}

/**
 * Registers the suite for the backend `name`: one test per case of cases.ts, one per model block, and the check that
 * each of the backend's kernels took work.
 * @example
 * conformance('ort', { tolerance: ORT_TOLERANCES })
 * conformance('ort', { tolerance: ORT_TOLERANCES, variant: { label: 'ort, native', create: () => createOrtBackend({ minMacs: 0 }) } })
 */
export function conformance(name: BackendName, options: ConformanceOptions): void {
  const { tolerance, variant } = options;
  const subject = watched(variant ? variant.create() : open(name));
  const repeatable = subject.backend.deterministic;
  const label = variant?.label ?? name;

  describe(`the ${label} backend conforms: every op, forward and backward, against js`, () => {
    for (const c of CASES) {
      test(c.name, (t) => {
        const ref = evaluate(jsBackend, c);
        const got = evaluate(subject.backend, c);
        t.diagnostic(`drift ${assertAgree(c.name, ref, got, tolerance[c.format]).toExponential(1)}`);
        if (repeatable) assertAgree(`${c.name} (run again)`, got, evaluate(subject.backend, c), 0);
      });
    }
  });

  describe(`the ${label} backend conforms: one block of each model family, forward and backward, against js`, () => {
    for (const [fixture, format] of BLOCKS) {
      const title = `${fixture}${format === 'f32' ? '' : ` (${format} weights)`}`;
      for (const [mode, run] of [['trained', trainBlock], ['decoding', decodeBlock]] as const) {
        test(`${title}: block 0 ${mode}`, async (t) => {
          const block = await loadModel(join(HF_FIXTURES, fixture), { part: [1, 2], ...loadOptions(format) });
          const ref = run(jsBackend, block);
          const got = run(subject.backend, block);
          // int8 and int4 are compared on what the block added to its input (ORT_TOLERANCES: quantized activations)
          const bases = format === 'int8' || format === 'int4' ? ref.inputs : [];
          t.diagnostic(`drift ${assertAgree(`${title} block`, ref.results, got.results, tolerance[format], bases).toExponential(1)}`);
          if (repeatable) assertAgree(`${title} block (run again)`, got.results, run(subject.backend, block).results, 0);
        });
      }
    }
  });

  test(`the ${label} backend's kernels each took work, and products ran on both sides of ORT_MIN_MACS`, () => {
    const offered = HOOKS.filter((h) => subject.backend[h] !== undefined);
    assert.deepEqual(offered.filter((h) => !subject.taken.has(h)), [], 'kernels the backend has that no case reached');
    assert.ok(subject.macs.some((m) => m < ORT_MIN_MACS) && subject.macs.some((m) => m >= ORT_MIN_MACS), 'products small and large');
  });
}
