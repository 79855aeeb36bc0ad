// Every op of the engine as a graph: each case of the conformance suite (cases.ts), traced on js and run as one ONNX
// graph through its ops' lowerings (src/tensor/backends/graph/) on onnxruntime's CPU provider, against js op by op
// within the ort backend's tolerance. The same lowerings make the webgpu backend's kernels and whole-step graphs.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ORT_BACKEND_TOLERANCE } from '../../../src/tensor/backends/ort/backend.ts';
import { compileOrtStep } from '../../../src/tensor/backends/ort/compiled-step.ts';
import { loadOrtRuntime } from '../../../src/tensor/backends/ort/runtime.ts';
import { jsBackend, noGrad, type Tensor, trace, withBackend } from '../../../src/tensor/index.ts';
import { CASES } from './cases.ts';
import { assertAgree, describeAgreement, type Result } from './compare.ts';
import { inputsOf } from './suite.ts';

const HOST_KV = 'its keys and values are host buffers (TimeMajorKV) read as they are at each call; a traced step\'s cache is tensors (cat)';

/** Cases whose op a graph cannot express, and why: they replay op by op. */
const NOT_LOWERED: Readonly<Record<string, string>> = {
  'dropout (seeded)': 'dropout draws from the engine\'s generator, which a graph does not hold',
  'attendTimeMajor, grouped-query (4 heads over 2), prefill': HOST_KV,
  'attendTimeMajor, grouped-query (8 heads over 2), decoding': HOST_KV,
  'attendTimeMajor, grouped-query (2 heads over 1), small': HOST_KV,
};

const ort = loadOrtRuntime();

for (const c of CASES) {
  test(`${c.name}: as one graph on onnxruntime's CPU provider`, (t) => {
    const inputs = inputsOf(c);
    const results = (out: Tensor | Tensor[]): Result[] => (Array.isArray(out) ? out : [out]).map((o, i) => ({ label: `output ${i}`, values: o.data }));
    // a compact weight is a constant of the step (as a model's parameters are), not an input fed at each run
    const free = inputs.filter((x) => x.packed === null);
    const call = (...xs: Tensor[]) => {
      let next = 0;
      return c.run(...inputs.map((x) => (x.packed === null ? xs[next++] : x)));
    };
    const { step, output } = withBackend(jsBackend, () => noGrad(() => trace(call, free)));
    let refused = '';
    const compiled = compileOrtStep(step, (model) => ort.session(model, 1, false), (why) => (refused = why));
    if (c.name in NOT_LOWERED) {
      assert.equal(compiled, null, `${c.name} was expected to be refused (${NOT_LOWERED[c.name]})`);
      return;
    }
    assert.ok(compiled !== null, `${c.name} was not lowered: ${refused}`);
    const got = compiled.run(free);
    const agreement = assertAgree(c.name, results(output), results([...got]), ORT_BACKEND_TOLERANCE[c.format]);
    t.diagnostic(describeAgreement(agreement));
  });
}
