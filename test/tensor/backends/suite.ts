/**
 * The conformance suite every compute backend passes (after libp2p's interface compliance tests: one suite, run by
 * every transport). A backend is done when it passes: every op of the engine (cases.ts) forward and backward, in every
 * format of weights, and one block of each model family (blocks.ts: trained, decoding, and as traced steps replayed
 * on it), each against the js backend's kernels within the tolerance the backend states (`backendTolerance`: whole
 * tensors and every element, compare.ts); a deterministic backend also gives the same bits on every run. Its last test
 * checks that each kernel the backend has took work (the large cases crossed its thresholds).
 *   conformance('ort')   // one file per registered backend, <name>.test.ts; registered.test.ts runs the others
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  type Backend,
  backendDevice,
  type BackendOptions,
  backendTolerance,
  createBackend,
  Generator,
  jsBackend,
  noGrad,
  randn,
  type Tensor,
  type TracedStep,
  withBackend,
} from '../../../src/tensor/index.ts';
import { ORT_MIN_MACS } from '../../../src/tensor/backends/ort/backend.ts';
import type { MatmulSpec } from '../../../src/tensor/kernels/matmul.ts';
import { BLOCKS, decodeBlock, loadBlock, tracedDecodingStep, tracedForward, tracedTraining, trainBlock } from './blocks.ts';
import { CASES, type ConformanceCase } from './cases.ts';
import { deviceConformance } from './device-suite.ts';
import { assertAgree, describeAgreement, type Result } from './compare.ts';

/** Another configuration of a backend to test than its defaults: its options, under a label. */
export interface ConformanceVariant {
  label: string;
  options: BackendOptions;
}

/** The seed of every case's inputs. */
const SEED = 45;

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

/** Kernels a backend may have besides matmul (Backend in src/tensor/backends/backend.ts). */
const HOOKS = ['packedLinear', 'unary', 'unaryBackward', 'softmax', 'layerNorm', 'attention', 'linears', 'gatedMlp'] as const;
type Hook = (typeof HOOKS)[number];

/** A backend that notes which kernels took work (returned true) and the sizes of the products it ran. */
interface Watched {
  backend: Backend;
  taken: Set<Hook>;
  macs: number[];
  /** The traced steps the backend was offered (compileStep), and how many it compiled. */
  steps: { offered: number; compiled: number };
}

/**
 * `backend` with its work noted: an object whose prototype is `backend` (so it has what `backend` has, and exactly the
 * kernels it has: ops test for them), with matmul and each kernel of HOOKS noting their work before they return, and
 * compileStep, where it has one, the steps it was offered.
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
  const steps = { offered: 0, compiled: 0 };
  const compile = backend.compileStep;
  if (compile !== undefined) {
    wrapped.compileStep = (step: TracedStep) => {
      const compiled = compile.call(backend, step);
      steps.offered++;
      if (compiled !== null) steps.compiled++;
      return compiled;
    };
  }
  return { backend: wrapped as unknown as Backend, taken, macs, steps };
}

/** The backend `name` made through the registry (with `options`), or why it cannot be tested here. */
function open(name: string, options: BackendOptions): Backend | { skip: string } {
  try {
    return createBackend(name, options);
  } catch (err) {
    if (err instanceof Error && err.name === 'BackendUnavailableError') return { skip: `it cannot be created here: ${err.message}` };
    throw err;
  }
}

/** The kinds of block runs: [title, what runs it]. */
const BLOCK_RUNS = [['trained', trainBlock], ['decoding', decodeBlock]] as const;
const TRACED_RUNS = [['forward', tracedForward], ['decoding step', tracedDecodingStep], ['training step', tracedTraining]] as const;

/**
 * Registers the suite for the registered backend `name` (made by `createBackend(name, variant.options)`, held to the
 * tolerance it states): one test per case of cases.ts, per model block trained, decoding and traced, and the check
 * that each of the backend's kernels took work. A backend that cannot be created here, or that computes on a device,
 * is one skipped test that says why.
 * @example
 * conformance('ort')
 * conformance('ort', { label: 'ort (every size native)', options: { minMacs: 0, minElements: 0 } })
 */
export function conformance(name: string, variant?: ConformanceVariant): void {
  const label = variant?.label ?? name;
  const opened = open(name, variant?.options ?? {});
  if ('skip' in opened) {
    test(`the ${label} backend conforms`, { skip: opened.skip }, () => {});
    return;
  }
  if (backendDevice(opened) !== 'cpu') {
    deviceConformance(label, name);
    return;
  }
  const subject = watched(opened);
  const tolerance = backendTolerance(opened);
  const repeatable = opened.deterministic;

  describe(`the ${label} backend conforms: every op, forward and backward, against js`, () => {
    for (const c of CASES) {
      test(c.name, (t) => {
        const ref = evaluate(jsBackend, c);
        const got = evaluate(subject.backend, c);
        t.diagnostic(describeAgreement(assertAgree(c.name, ref, got, tolerance[c.format])));
        if (repeatable) assertAgree(`${c.name} (run again)`, got, evaluate(subject.backend, c), 0);
      });
    }
  });

  describe(`the ${label} backend conforms: one block of each model family, forward and backward, against js`, () => {
    for (const [fixture, format] of BLOCKS) {
      const title = `${fixture}${format === 'f32' ? '' : ` (${format} weights)`}`;
      // int8 and int4 are compared on what the block added to its input (ORT_TOLERANCES: quantized activations)
      const based = format === 'int8' || format === 'int4';
      for (const [mode, run] of BLOCK_RUNS) {
        test(`${title}: block 0 ${mode}`, async (t) => {
          const block = await loadBlock(fixture, format);
          const ref = run(jsBackend, block);
          const got = run(subject.backend, block);
          t.diagnostic(describeAgreement(assertAgree(`${title} block`, ref.results, got.results, tolerance[format], based ? ref.inputs : [])));
          if (repeatable) assertAgree(`${title} block (run again)`, got.results, run(subject.backend, block).results, 0);
        });
      }
    }
  });

  const compiles = subject.backend.compileStep !== undefined ? ', compiled (compileStep)' : ', op by op';
  describe(`the ${label} backend conforms: one block of each model family as a step traced on js, replayed${compiles}`, () => {
    for (const [fixture, format] of BLOCKS) {
      const title = `${fixture}${format === 'f32' ? '' : ` (${format} weights)`}`;
      const based = format === 'int8' || format === 'int4';
      for (const [mode, run] of TRACED_RUNS) {
        if (run === tracedTraining && format !== 'f32') continue;
        test(`${title}: block 0's traced ${mode}`, async (t) => {
          const block = await loadBlock(fixture, format);
          const { ref, got } = await run(subject.backend, block);
          t.diagnostic(describeAgreement(assertAgree(`${title} traced ${mode}`, ref.results, got.results, tolerance[format], based ? ref.inputs : [])));
        });
      }
    }
  });

  test(`the ${label} backend's kernels each took work, and products ran on both sides of ORT_MIN_MACS`, (t) => {
    const offered = HOOKS.filter((h) => subject.backend[h] !== undefined);
    assert.deepEqual(offered.filter((h) => !subject.taken.has(h)), [], 'kernels the backend has that no case reached');
    assert.ok(subject.macs.some((m) => m < ORT_MIN_MACS) && subject.macs.some((m) => m >= ORT_MIN_MACS), 'products small and large');
    // a backend that compiles steps was offered each traced block (once per step), whatever it made of them
    if (subject.backend.compileStep !== undefined) assert.ok(subject.steps.offered > 0, 'no traced step reached compileStep');
    t.diagnostic(`traced steps compiled: ${subject.steps.compiled} of ${subject.steps.offered} offered`);
  });
}
