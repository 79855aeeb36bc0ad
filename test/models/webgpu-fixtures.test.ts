// The transformers fixtures of gpt2, llama3, qwen3 and mixtral on the webgpu backend (on SwiftShader here: see
// scripts/test.mjs), each step a graph traced on the host and compiled on the device (DeviceRunner): the logits within
// 1e-4 relative of float32 transformers (and every family's 24 greedy tokens, the KV cache on the device, below),
// and at int4 the logits within INT4_FROM_ORT of `--backend ort --quantize int4`'s (ort's MatMulNBits quantizes the
// activations to int8 blocks; the graphs on the GPU dequantize the weights of a mixture's experts exactly). Measured on
// SwiftShader: logits 3.6e-7 to 7.7e-7 from transformers; int4 5.5e-3 (gpt2) to 0.107 (mixtral) from ort's, and 2.6e-7
// to 9.1e-3 (qwen3) from js's exact dequantization.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { loadModel } from '../../src/models/index.ts';
import { DeviceRunner, deviceStepModel } from '../../src/models/generation/device-step.ts';
import { generateWith } from '../../src/models/generation/generate.ts';
import { createBackend, jsBackend, loadBackend, noGrad, withBackend } from '../../src/tensor/index.ts';
import { hfFixtureNames, readHFReference } from '../helpers/hf-fixtures.ts';
import { relErr } from '../helpers/weights.ts';

const FIXTURES = ['gpt2', 'llama3', 'qwen3', 'mixtral'];
/** int4 logits on webgpu against ort's int4 (relative L2): measured 5e-3 (gpt2) to 0.107 (mixtral, see the top). */
const INT4_FROM_ORT = 0.15;

describe('the transformers fixtures on --backend webgpu', () => {
  for (const name of FIXTURES) {
    // (their 24 greedy tokens: below, with every family's)
    test(`${name}: logits equal transformers', int4 within the stated tolerance`, async (t) => {
      const ref = readHFReference(name);
      const model = await loadModel(ref.dir);
      const logits = await new DeviceRunner(model, 'webgpu').step(ref.inputIds);
      const logitsErr = relErr(logits.data, ref.logits.data);
      const q = await loadModel(ref.dir, { quantize: 'int4' });
      const onGpu = await new DeviceRunner(q, 'webgpu').step(ref.inputIds);
      const fromOrt = relErr(onGpu.data, withBackend(createBackend('ort'), () => noGrad(() => q.forward(ref.inputIds))).data);
      const fromJs = relErr(onGpu.data, withBackend(jsBackend, () => noGrad(() => q.forward(ref.inputIds))).data);
      t.diagnostic(`logits ${logitsErr.toExponential(2)}; int4 from ort ${fromOrt.toExponential(2)}, from js ${fromJs.toExponential(2)}`);
      assert.ok(logitsErr < 1e-4, `${name}: logits relative error ${logitsErr}`);
      assert.ok(fromOrt < INT4_FROM_ORT, `${name}: int4 logits ${fromOrt} from ort's`);
    });
  }
});

/**
 * Families whose masks depend on a key's index in the cache decode with a graph per position: one of them (mistral) is
 * enough to show it, the others (gemma2, gemma3, bloom: 24 graphs each on SwiftShader) would only add time to CI.
 */
const PER_POSITION_SHOWN = new Set(['mistral']);
const PER_POSITION = new Set(['mistral', 'gemma2', 'gemma3', 'bloom']);

describe('every family decoding on --backend webgpu (those that need a graph per position: one of them)', () => {
  for (const name of hfFixtureNames().filter((n) => !PER_POSITION.has(n) || PER_POSITION_SHOWN.has(n))) {
    test(`${name}: transformers' 24 greedy tokens, the KV cache on the device; one graph for every position where it can be`, async (t) => {
      const ref = readHFReference(name);
      const model = await loadModel(ref.dir);
      const steps = (loadBackend('webgpu') as unknown as { steps: { compiled: number } }).steps;
      const before = steps.compiled;
      const [tokens] = await generateWith(deviceStepModel(model, 'webgpu'), [ref.prompt], {
        maxNewTokens: ref.greedy.length, temperature: 0, stopTokens: [],
      });
      const graphs = steps.compiled - before;
      t.diagnostic(`${graphs} graphs for a prompt of ${ref.prompt.length} and ${ref.greedy.length} tokens`);
      assert.deepEqual(tokens, ref.greedy, `${name}: greedy tokens`);
      // a bounded cache: the prompt's graph, then one per power-of-two capacity (32, 64); a sliding window or ALiBi masks by
      // index in the cache, so those families compile a step per position
      const bounded = (model.config as { slidingWindow?: number }).slidingWindow === undefined && model.config.arch !== 'bloom';
      if (bounded) assert.ok(graphs <= 3, `${name}: ${graphs} graphs`);
      else assert.equal(graphs, ref.greedy.length, `${name}: a graph per step`);
    });
  }
});
