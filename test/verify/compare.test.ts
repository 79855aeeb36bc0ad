import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  createModel, gpt2Config, layerParameters, llamaConfig, type ModelConfig, type ModelLayer, runLayers,
} from '../../src/models/index.ts';
import { type Backend, createOrtBackend, Generator, ortAvailable, randn, type Tensor, withBackend } from '../../src/tensor/index.ts';
import { agree, drift, ORT_TOLERANCE } from '../../src/verify/compare.ts';

describe('drift', () => {
  test('is 0 for the same values and for two all-zero arrays', () => {
    assert.equal(drift(Float32Array.of(1, -2, 3), Float32Array.of(1, -2, 3)), 0);
    assert.equal(drift(new Float32Array(8), new Float32Array(8)), 0);
    assert.equal(drift(new Float32Array(0), new Float32Array(0)), 0);
  });

  test('is ‖a − b‖₂ / ‖a‖₂, relative to the first argument', () => {
    assert.ok(Math.abs(drift(Float32Array.of(3, 4), Float32Array.of(3, 4.005)) - 1e-3) < 1e-6);
    assert.ok(Math.abs(drift(Float32Array.of(3, 4), Float32Array.of(6, 8)) - 1) < 1e-12);
    assert.ok(Math.abs(drift(Float32Array.of(6, 8), Float32Array.of(3, 4)) - 0.5) < 1e-12);
  });

  test('is Infinity for different lengths and for unmatched non-finite values', () => {
    assert.equal(drift(new Float32Array(3), new Float32Array(4)), Infinity);
    assert.equal(drift(Float32Array.of(1, 2), Float32Array.of(1, NaN)), Infinity);
    assert.equal(drift(Float32Array.of(NaN, 2), Float32Array.of(1, 2)), Infinity);
    assert.equal(drift(Float32Array.of(Infinity, 2), Float32Array.of(-Infinity, 2)), Infinity);
    assert.equal(drift(Float32Array.of(Infinity, 2), Float32Array.of(3e38, 2)), Infinity);
  });

  test('skips non-finite values that both hold at the same place', () => {
    assert.equal(drift(Float32Array.of(NaN, Infinity, 2), Float32Array.of(NaN, Infinity, 2)), 0);
    assert.ok(Math.abs(drift(Float32Array.of(-Infinity, 3, 4), Float32Array.of(-Infinity, 3, 4.005)) - 1e-3) < 1e-6);
  });

  test('is huge when the reference is all zero and the other is not', () => {
    assert.ok(drift(new Float32Array(4), Float32Array.of(0, 0, 1e-30, 0)) > 1e6);
  });
});

describe('agree', () => {
  test('js: the same bytes', () => {
    const a = Float32Array.of(1.5, -2, 1e-40, NaN);
    assert.equal(agree('js', a, a.slice()), true);
    const next = a.slice();
    next[0] = Math.fround(1.5 + 2 ** -23);
    assert.equal(agree('js', a, next), false, 'one ulp');
  });

  test('js: -0 and 0 differ, and so do NaNs with different payloads', () => {
    assert.equal(agree('js', Float32Array.of(0, 1), Float32Array.of(-0, 1)), false);
    const x = new Float32Array(1);
    const y = new Float32Array(1);
    new Uint32Array(x.buffer)[0] = 0x7fc00000;
    new Uint32Array(y.buffer)[0] = 0x7fc00001;
    assert.ok(Number.isNaN(x[0]) && Number.isNaN(y[0]));
    assert.equal(agree('js', x, y), false);
  });

  test('js: views at an offset compare their own elements', () => {
    const buf = Float32Array.of(9, 1, 2, 3);
    assert.equal(agree('js', buf.subarray(1), Float32Array.of(1, 2, 3)), true);
    assert.equal(agree('js', buf.subarray(0, 3), Float32Array.of(1, 2, 3)), false);
  });

  test('js and ort: different lengths never agree', () => {
    assert.equal(agree('js', new Float32Array(2), new Float32Array(3)), false);
    assert.equal(agree('ort', new Float32Array(2), new Float32Array(3)), false);
  });

  test('ort: within ORT_TOLERANCE, not beyond', () => {
    const a = Float32Array.of(3, 4);
    assert.equal(agree('ort', a, Float32Array.of(0, -0).map((v, i) => a[i] + v)), true);
    assert.equal(agree('ort', Float32Array.of(0, 1), Float32Array.of(-0, 1)), true, '-0 and 0 are equal values');
    assert.equal(agree('ort', a, Float32Array.of(3, 4 + 5 * 0.5 * ORT_TOLERANCE)), true);
    assert.equal(agree('ort', a, Float32Array.of(3, 4 + 5 * 2 * ORT_TOLERANCE)), false);
    assert.equal(agree('ort', a, Float32Array.of(3, NaN)), false);
  });

  test('ORT_TOLERANCE lies between float32 roundoff and the 1e-3 noise it must catch', () => {
    assert.ok(ORT_TOLERANCE > 2 ** -24 && ORT_TOLERANCE < 1e-4);
  });

  test('an unknown backend (from an untrusted record) is a typed error', () => {
    assert.throws(() => agree('cuda' as 'js', new Float32Array(1), new Float32Array(1)), { name: 'InvalidArgumentError' });
  });
});

/** A worker's section (both blocks of a 2-block model) with initialised weights. */
interface Section {
  layers: ModelLayer[];
  params: Tensor[];
  config: ModelConfig;
  batch: number;
  tokens: number;
}

function section(config: ModelConfig, batch: number, tokens: number): Section {
  const layers = createModel(config, { seed: 3 }).layers.slice(1, 1 + config.layers);
  return { layers, params: [...layerParameters(layers).values()], config, batch, tokens };
}

/** Forward and backward of a section on `backend`: its output, then the input gradient and every parameter gradient. */
function run(s: Section, input: Tensor, grad: Tensor, backend: Backend): { forward: Float32Array; backward: Float32Array[] } {
  return withBackend(backend, () => {
    for (const p of s.params) p.grad = null;
    const x = input.detach();
    x.requiresGrad = true;
    const y = runLayers(s.layers, x, {}, s.config.maxPositions);
    const forward = (y.data as Float32Array).slice();
    y.backward(grad);
    const backward = [x, ...s.params].map((t) => (t.grad!.data as Float32Array).slice());
    return { forward, backward };
  });
}

function noisy(x: Float32Array, rng: Generator, relative: number): Float32Array {
  let norm = 0;
  for (const v of x) norm += v * v;
  const scale = (relative * Math.sqrt(norm)) / Math.sqrt(x.length);
  return x.map((v) => v + scale * rng.normal());
}

describe('ort outputs (1 and 2 intra-op threads)', { skip: ortAvailable() ? false : 'onnxruntime does not load on this machine' }, () => {
  // At h128 × 64 tokens the products pass SINGLE_THREAD_BELOW_MACS, so the 2-thread backend really splits them.
  const sections = () => [
    section(gpt2Config({ vocabSize: 64, hidden: 64, layers: 2, heads: 4, maxPositions: 64 }), 2, 32),
    section(llamaConfig({ vocabSize: 64, hidden: 64, layers: 2, heads: 4, kvHeads: 2, intermediate: 172, maxPositions: 64 }), 2, 32),
    section(gpt2Config({ vocabSize: 64, hidden: 128, layers: 2, heads: 4, maxPositions: 64 }), 1, 64),
    section(llamaConfig({ vocabSize: 64, hidden: 128, layers: 2, heads: 4, kvHeads: 2, intermediate: 344, maxPositions: 64 }), 1, 64),
  ];
  const inputs = (s: Section, i: number) => ({
    input: randn([s.batch, s.tokens, s.config.hidden], { seed: 10_000 + i }),
    grad: randn([s.batch, s.tokens, s.config.hidden], { seed: 20_000 + i }).mul(1 / Math.sqrt(s.batch * s.tokens)),
  });

  test('1,000 honest ort computations at 1 and 2 threads: no false positive', () => {
    const one = createOrtBackend({ threads: 1 });
    // idle pool threads sleep: spinning changes no result, only burns the core a neighbouring test file needs
    const two = createOrtBackend({ threads: 2, spinning: false });
    const list = sections();
    let computations = 0;
    let worst = 0;
    for (let i = 0; i < 500; i++) {
      const s = list[i % list.length];
      const { input, grad } = inputs(s, i);
      const a = run(s, input, grad, one);
      const b = run(s, input, grad, two);
      // One computation: the forward; another: the backward (the input gradient and every parameter gradient).
      worst = Math.max(worst, drift(a.forward, b.forward));
      assert.ok(agree('ort', a.forward, b.forward), `forward ${i}: drift ${drift(a.forward, b.forward)}`);
      computations++;
      a.backward.forEach((g, k) => {
        worst = Math.max(worst, drift(g, b.backward[k]));
        assert.ok(agree('ort', g, b.backward[k]), `backward ${i}, gradient ${k}: drift ${drift(g, b.backward[k])}`);
      });
      computations++;
    }
    assert.equal(computations, 1000);
    assert.ok(worst < ORT_TOLERANCE / 10, `worst honest drift ${worst} is within 10× of the tolerance`);
  });

  test('noise at 1e-3 relative is caught on ort', () => {
    const ort = createOrtBackend({ threads: 2, spinning: false });
    const rng = new Generator(7);
    let caught = 0;
    sections().forEach((s, j) => {
      for (let i = 0; i < 5; i++) {
        const { input, grad } = inputs(s, 1000 + 5 * j + i);
        const { forward, backward } = run(s, input, grad, ort);
        for (const x of [forward, ...backward]) {
          const y = noisy(x, rng, 1e-3);
          assert.ok(!agree('ort', x, y), `noisy output agrees: drift ${drift(x, y)}`);
          caught++;
        }
      }
    });
    assert.ok(caught > 100);
  });
});
