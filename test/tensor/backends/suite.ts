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
import { type CausalLM, loadModel } from '../../../src/models/index.ts';
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

/** The same bytes: compared as 32-bit words, so NaN payloads and the sign of zero count. */
function sameBits(a: Tensor['data'], b: Tensor['data']): boolean {
  if (a.constructor !== b.constructor || a.length !== b.length) return false;
  const x = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const y = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  return x.every((v, i) => v === y[i]);
}

/**
 * Asserts that `got` holds the results of `ref` (the same labels) within `tolerance` (relative L2 distance from the
 * reference; 0: the same bits; int32 results always exactly). With `base` (the input of a block computed with int8 or
 * int4 weights, under the label of its output), that result's distance is of what the block added to its input, as
 * src/verify/compare.ts measures it. Returns the largest distance.
 */
export function assertAgree(what: string, ref: Result[], got: Result[], tolerance: number, base?: Result): number {
  assert.deepEqual(got.map((r) => r.label), ref.map((r) => r.label), `${what}: the same outputs and gradients`);
  let worst = 0;
  ref.forEach((r, i) => {
    const g = got[i].values;
    const label = `${what}, ${r.label}`;
    if (tolerance === 0 || r.values instanceof Int32Array) {
      assert.ok(sameBits(r.values, g), `${label}: not the reference's bits`);
      return;
    }
    const withBase = base?.label === r.label ? (base.values as Float32Array) : undefined;
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

/** `backend` with its work noted; it has exactly the kernels `backend` has (ops test for them). */
function watched(backend: Backend): Watched {
  const taken = new Set<Hook>();
  const macs: number[] = [];
  const wrapped: Record<string, unknown> = {
    name: backend.name,
    deterministic: backend.deterministic,
    matmul(a: Float32Array, b: Float32Array, out: Float32Array, spec: MatmulSpec, bias?: Float32Array) {
      macs.push(spec.batch * spec.m * spec.k * spec.n);
      backend.matmul(a, b, out, spec, bias);
    },
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

/** One block's forward and backward: its output, its input's gradient, each parameter's gradient by name. */
function runBlock(backend: Backend, block: CausalLM): { results: Result[]; input: Tensor['data'] } {
  return withBackend(backend, () => {
    const params = [...block.hfStateDict()];
    for (const [, p] of params) p.grad = null;
    const x = randn([...BLOCK_INPUT, block.config.hidden], { generator: new Generator(SEED) });
    x.requiresGrad = true;
    const y = block.forward(x);
    y.mul(randn(y.shape, { seed: 1000 })).sum().backward();
    const results: Result[] = [{ label: 'output', values: y.data }, { label: 'gradient of the input', values: x.grad!.data }];
    for (const [name, p] of params) if (p.grad) results.push({ label: `gradient of ${name}`, values: p.grad.data });
    return { results, input: x.data };
  });
}

/**
 * Registers the suite for the backend `name`: one test per case of cases.ts, one per model block, and the check that
 * each of the backend's kernels took work.
 * @example
 * conformance('ort', { tolerance: ORT_TOLERANCES })
 */
export function conformance(name: BackendName, options: ConformanceOptions): void {
  const subject = watched(open(name));
  const { tolerance } = options;
  const repeatable = subject.backend.deterministic;

  describe(`the ${name} backend conforms: every op, forward and backward, against js`, () => {
    for (const c of CASES) {
      test(c.name, (t) => {
        const ref = evaluate(jsBackend, c);
        const got = evaluate(subject.backend, c);
        t.diagnostic(`drift ${assertAgree(c.name, ref, got, tolerance[c.format]).toExponential(1)}`);
        if (repeatable) assertAgree(`${c.name} (run again)`, got, evaluate(subject.backend, c), 0);
      });
    }
  });

  describe(`the ${name} backend conforms: one block of each model family, forward and backward, against js`, () => {
    for (const [fixture, format] of BLOCKS) {
      test(`${fixture}${format === 'f32' ? '' : ` (${format} weights)`}: block 0`, async (t) => {
        const block = await loadModel(join(HF_FIXTURES, fixture), { part: [1, 2], ...loadOptions(format) });
        const ref = runBlock(jsBackend, block);
        const got = runBlock(subject.backend, block);
        // int8 and int4 are compared on what the block added to its input (ORT_TOLERANCES: quantized activations)
        const base = format === 'int8' || format === 'int4' ? { label: 'output', values: ref.input } : undefined;
        t.diagnostic(`drift ${assertAgree(`${fixture} block`, ref.results, got.results, tolerance[format], base).toExponential(1)}`);
        if (repeatable) assertAgree(`${fixture} block (run again)`, got.results, runBlock(subject.backend, block).results, 0);
      });
    }
  });

  test(`the ${name} backend's kernels each took work, and products ran on both sides of ORT_MIN_MACS`, () => {
    const offered = HOOKS.filter((h) => subject.backend[h] !== undefined);
    assert.deepEqual(offered.filter((h) => !subject.taken.has(h)), [], 'kernels the backend has that no case reached');
    assert.ok(subject.macs.some((m) => m < ORT_MIN_MACS) && subject.macs.some((m) => m >= ORT_MIN_MACS), 'products small and large');
  });
}
