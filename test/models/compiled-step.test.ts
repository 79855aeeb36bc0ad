// Whole-step graphs on the CPU (#46): every family's fixture, its whole forward traced on js and compiled as one ONNX
// graph on onnxruntime's CPU provider (ort's compileStep, through the lowerings of src/tensor/backends/graph/), equals
// the same forward op by op on ort within ORT_TOLERANCE (relative L2 of the logits), and transformers' logits within
// the bar every fixture is held to (1e-4; llama3-bf16-sharded 5e-3, its reference's rotary being bf16-rounded).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { loadModel } from '../../src/models/index.ts';
import { compileOrtStep } from '../../src/tensor/backends/ort/compiled-step.ts';
import { loadOrtRuntime } from '../../src/tensor/backends/ort/runtime.ts';
import { createBackend, jsBackend, noGrad, type Tensor, trace, withBackend } from '../../src/tensor/index.ts';
import { drift, ORT_TOLERANCE } from '../../src/verify/index.ts';
import { hfFixtureNames, readHFReference } from '../helpers/hf-fixtures.ts';

const ort = loadOrtRuntime();
const BAR: Readonly<Record<string, number>> = { 'llama3-bf16-sharded': 5e-3 };

describe('every family\'s whole forward as one graph on onnxruntime\'s CPU provider', () => {
  for (const name of hfFixtureNames()) {
    test(name, async (t) => {
      const ref = readHFReference(name);
      const model = await loadModel(ref.dir);
      const { step } = withBackend(jsBackend, () => noGrad(() => trace((ids: Tensor) => model.forward(ids), [ref.inputIds])));
      let refused = '';
      const compiled = compileOrtStep(step, (m) => ort.session(m, 1, false), (why) => (refused = why));
      assert.ok(compiled !== null, `${name}: not one graph: ${refused}`);
      const [graph] = compiled.run([ref.inputIds]);
      const opByOp = withBackend(createBackend('ort', { threads: 1, compileSteps: false }), () => noGrad(() => model.forward(ref.inputIds)));
      const fromOrt = drift(opByOp.data as Float32Array, graph.data as Float32Array);
      const fromHF = drift(ref.logits.data as Float32Array, graph.data as Float32Array);
      t.diagnostic(`from op-by-op ort ${fromOrt.toExponential(2)}, from transformers ${fromHF.toExponential(2)}`);
      assert.ok(fromOrt <= ORT_TOLERANCE, `${name}: ${fromOrt} from op-by-op ort`);
      assert.ok(fromHF < (BAR[name] ?? 1e-4), `${name}: ${fromHF} from transformers`);
    });
  }
});
