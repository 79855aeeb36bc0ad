/**
 * The conformance suite (suite.ts) for a device backend, one whose tensors live in its own memory (`t.to(device)`,
 * `await t.read()`): every op of cases.ts, forward and backward, on tensors moved to the device (op by op:
 * Backend.runOp, and the gradient graphs its autograd nodes run), and one block of each model family as traced steps
 * compiled on the device (Backend.compileStep: forward, a decoding step with its KV cache as inputs, and a training
 * step: forward and backward as one graph), each against js within the backend's tolerance. Each op as a one-op traced
 * step is compiled on ort by graph.test.ts (the same lowerings, through lowerStep). What a device backend does not do
 * yet is asserted, not skipped: the ops it refuses are a DeviceOpUnsupportedError (DEVICE_REFUSED), and every traced
 * block must compile whole (no step falls back to op by op) except a mixture's training step (HIDDEN_EXPERTS).
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  type Backend,
  backendDevice,
  backendTolerance,
  jsBackend,
  loadBackend,
  noGrad,
  randn,
  type Tensor,
} from '../../../src/tensor/index.ts';
import { BLOCKS, loadBlock, tracedDecodingStep, tracedForward, tracedTraining } from './blocks.ts';
import { CASES, type ConformanceCase } from './cases.ts';
import { assertAgree, describeAgreement, type Result } from './compare.ts';
import { evaluate, inputsOf } from './suite.ts';

const HOST_KV = 'its keys and values are host buffers (TimeMajorKV), not tensors: on a device the cache is tensors (cat)';

/** Cases a device backend refuses, and why: each must be a DeviceOpUnsupportedError there, not a wrong number. */
export const DEVICE_REFUSED: Readonly<Record<string, string>> = {
  'dropout (seeded)': 'its mask is drawn from the engine\'s generator on the host',
  'attendTimeMajor, grouped-query (4 heads over 2), prefill': HOST_KV,
  'attendTimeMajor, grouped-query (8 heads over 2), decoding': HOST_KV,
  'attendTimeMajor, grouped-query (2 heads over 1), small': HOST_KV,
};

/** Families whose training step does not compile on a device, and why. */
const HIDDEN_EXPERTS: Readonly<Record<string, string>> = Object.fromEntries(['mixtral', 'qwen3_moe'].map((f) => [f,
  'a mixture\'s experts are stored in its graph (routedExperts), so no gradient reaches them: its training step is refused']));

const outputs = async (out: Tensor | Tensor[]): Promise<Result[]> =>
  Promise.all((Array.isArray(out) ? out : [out]).map(async (o, i) => ({ label: `output ${i}`, values: await o.read() })));

/**
 * The case run on tensors moved to `device` as the suite's `evaluate` runs it on the host: its outputs, then the
 * gradient of Σᵢ outputᵢ · wᵢ (the same seeded w, moved there) to every float input, through the device's backward:
 * each output's backward seeded with its wᵢ, which is that sum's gradient.
 */
async function evaluateOn(device: string, c: ConformanceCase): Promise<Result[]> {
  const inputs = inputsOf(c).map((x) => {
    if (x.dtype === 'int32') return x.to(device);
    const moved = x.to('float32').to(device);
    if (c.noGrad !== true) moved.requiresGrad = true;
    return moved;
  });
  const ran = c.noGrad === true ? noGrad(() => c.run(...inputs)) : c.run(...inputs);
  const outs = Array.isArray(ran) ? ran : [ran];
  const results = await outputs(outs);
  const graded = outs.filter((o) => o.requiresGrad);
  if (graded.length === 0) return results;
  // d(Σᵢ outputᵢ · wᵢ)/d(outputᵢ) = wᵢ: each output's backward seeded with its w (no loss graphs on the device)
  graded.forEach((o, i) => o.backward(randn(o.shape, { seed: 1000 + i }).to(device), { retainGraph: i < graded.length - 1 }));
  for (const [i, x] of inputs.entries()) if (x.grad) results.push({ label: `gradient of input ${i}`, values: await x.grad.read() });
  return results;
}

/** What a device backend says it did with the steps it was offered (the webgpu backend's `steps`). */
function stepCounts(backend: Backend): { compiled: number; refused: string[] } {
  const steps = (backend as { steps?: { compiled: number; refused: string[] } }).steps;
  assert.ok(steps !== undefined, `device backend '${backend.name}' does not count the steps it compiles (steps)`);
  return steps;
}

/**
 * Registers the device suite for the backend registered as `name`: the instance the registry shares (loadBackend),
 * which owns the memory `t.to(device)` moves tensors into and compiles the steps that run there.
 */
export function deviceConformance(label: string, name: string): void {
  const backend = loadBackend(name);
  const device = backendDevice(backend);
  const tolerance = backendTolerance(backend);
  const steps = stepCounts(backend);

  describe(`the ${label} backend conforms on '${device}': every op, forward and backward, on tensors moved there, op by op, against js`, () => {
    for (const c of CASES) {
      test(c.name, async (t) => {
        const inputs = inputsOf(c);
        if (inputs.some((x) => x.packed !== null)) {
          // a compact weight does not move to a device: its products run inside traced steps (below), where it is baked
          assert.throws(() => inputs.map((x) => x.to(device)), /compact format/);
          return;
        }
        if (c.name in DEVICE_REFUSED) {
          // refused by the backend, or earlier, where the case reads its device inputs as host buffers
          const refusal = { name: /^(DeviceOpUnsupportedError|DeviceDataError)$/ };
          assert.throws(() => noGrad(() => c.run(...inputs.map((x) => x.to(device)))), refusal, DEVICE_REFUSED[c.name]);
          return;
        }
        const got = await evaluateOn(device, c);
        t.diagnostic(describeAgreement(assertAgree(c.name, evaluate(jsBackend, c), got, tolerance[c.format])));
      });
    }
  });

  describe(`the ${label} backend conforms on '${device}': one block of each model family as a traced step compiled there`, () => {
    for (const [fixture, format] of BLOCKS) {
      const title = `${fixture}${format === 'f32' ? '' : ` (${format} weights)`}`;
      const based = format === 'int8' || format === 'int4';
      for (const [mode, run] of [['forward', tracedForward], ['decoding step', tracedDecodingStep], ['training step', tracedTraining]] as const) {
        if (run === tracedTraining && format !== 'f32') continue;
        test(`${title}: block 0's traced ${mode}`, async (t) => {
          const block = await loadBlock(fixture, format);
          const before = steps.compiled;
          if (run === tracedTraining && fixture in HIDDEN_EXPERTS) {
            // refused whole; op by op, the device input then meets the block's weights on the host
            await assert.rejects(run(backend, block), { name: 'DeviceMismatchError' });
            assert.match(steps.refused.at(-1) ?? '', /routedExperts/, HIDDEN_EXPERTS[fixture]);
            return;
          }
          const { ref, got } = await run(backend, block);
          assert.equal(steps.compiled, before + 1, `${title}'s traced ${mode} did not compile as one graph on '${device}': ${steps.refused.at(-1)}`);
          t.diagnostic(describeAgreement(assertAgree(`${title} traced ${mode}`, ref.results, got.results, tolerance[format], based ? ref.inputs : [])));
        });
      }
    }
  });
}
