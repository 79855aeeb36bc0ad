// A whole training step as one graph (#46): forward, cross-entropy, backward, AdamW's step and zeroGrad, traced once
// on js and compiled as one ONNX graph (src/tensor/backends/graph/step-training.ts) on onnxruntime's CPU provider and
// on the webgpu backend (SwiftShader here), against the same steps called directly on js: each step's loss within
// 1e-5 relative, and the trained weights and AdamW moments within ORT_TOLERANCE (relative L2) after the last step.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { type CausalLM, createModel, gpt2Config, llamaConfig, qwen3MoeConfig } from '../../src/models/index.ts';
import { AdamW } from '../../src/nn/index.ts';
import { compileOrtStep } from '../../src/tensor/backends/ort/compiled-step.ts';
import { loadOrtRuntime } from '../../src/tensor/backends/ort/runtime.ts';
import { DeviceSection, StageExecutor } from '../../src/pipeline/index.ts';
import {
  crossEntropy, Generator, jsBackend, loadBackend, randint, randn, type Tensor, trace, type TracedStep, withBackend,
} from '../../src/tensor/index.ts';
import { drift, ORT_TOLERANCE } from '../../src/verify/index.ts';

const STEPS = 4;
const CONFIGS = {
  gpt2: gpt2Config({ layers: 2, hidden: 32, heads: 4, vocabSize: 64, maxPositions: 32 }),
  llama: llamaConfig({ layers: 2, hidden: 32, heads: 4, kvHeads: 2, intermediate: 64, vocabSize: 64, maxPositions: 32 }),
};

/** A model and its AdamW, and the training step that calls both. */
function trainer(name: keyof typeof CONFIGS) {
  const model = createModel(CONFIGS[name], { seed: 7 });
  const opt = new AdamW(model.parameters(), { lr: 1e-2, weightDecay: 0.1 });
  const run = (ids: Tensor, targets: Tensor): Tensor => {
    const loss = crossEntropy(model.forward(ids), targets);
    loss.backward();
    opt.step();
    opt.zeroGrad();
    return loss;
  };
  return { model, opt, run };
}

/** One batch, STEPS times: the loss falls as the model learns it. */
const batches = () => {
  const g = new Generator(11);
  const batch = [randint(0, 64, [2, 8], { generator: g }), randint(0, 64, [2, 8], { generator: g })];
  return Array.from({ length: STEPS }, () => batch);
};

/**
 * What the steps left: every parameter and its moments, by name. GPT-2's key bias (the middle third of c_attn.bias) is
 * left out: its gradient is exactly zero in exact arithmetic (adding q·b_k to every score of a row leaves the softmax
 * as it was), so in floats it is rounding noise, which Adam divides by its own square root into steps of ±lr whose
 * signs no two engines share. The losses show what it does to the model (nothing).
 */
function state(model: CausalLM, opt: AdamW): Map<string, Float32Array> {
  const out = new Map<string, Float32Array>();
  for (const [name, p] of model.namedParameters()) {
    const parts = [p.data as Float32Array, ...(opt.momentParts(p)?.parts ?? [])];
    const keyBias = name.endsWith('attn.c_attn.bias') ? p.size / 3 : 0;
    parts.forEach((x, i) => out.set(`${name} ${['', 'm', 'v'][i]}`, keyBias ? Float32Array.of(...x.slice(0, keyBias), ...x.slice(2 * keyBias)) : x));
  }
  return out;
}

type Compile = (step: TracedStep) => { run(inputs: readonly Tensor[]): readonly Tensor[] } | null;
const ort = loadOrtRuntime();
const engines: Record<string, { compile: Compile; move: (t: Tensor) => Tensor }> = {
  'ort (CPU provider)': { compile: (step) => compileOrtStep(step, (m) => ort.session(m, 1, false)), move: (t) => t },
  'webgpu': { compile: (step) => loadBackend('webgpu').compileStep!(step), move: (t) => t.to('webgpu') },
};

describe('a training step (forward, loss, backward, AdamW, zeroGrad) as one graph', () => {
  for (const name of Object.keys(CONFIGS) as (keyof typeof CONFIGS)[]) {
    for (const [engine, { compile, move }] of Object.entries(engines)) {
      test(`${name} on ${engine}: the losses of ${STEPS} steps, the weights and moments after them, equal js's`, async (t) => {
        const data = batches();
        const direct = trainer(name);
        const expected = withBackend(jsBackend, () => data.map(([ids, targets]) => direct.run(ids, targets).item()));
        const traced = trainer(name);
        // the trace runs the first step on js; the others run as one graph each
        const { step, output } = withBackend(jsBackend, () => trace(traced.run, data[0]));
        const compiled = compile(step as TracedStep);
        assert.ok(compiled !== null, `${name}'s training step did not compile on ${engine}`);
        const losses = [output.item()];
        for (const inputs of data.slice(1)) losses.push((await compiled.run(inputs.map(move))[0].read())[0]);
        t.diagnostic(`losses ${losses.map((l) => l.toFixed(6)).join(' ')} (js ${expected.map((l) => l.toFixed(6)).join(' ')})`);
        losses.forEach((l, i) => assert.ok(Math.abs(l - expected[i]) <= 1e-5 * Math.abs(expected[i]), `step ${i}: ${l} against ${expected[i]}`));
        assert.ok(expected[STEPS - 1] < expected[0], 'the steps learned');
        const [got, want] = [state(traced.model, traced.opt), state(direct.model, direct.opt)];
        assert.deepEqual([...got.keys()], [...want.keys()], 'the same parameters and moments');
        const drifts = [...got].map(([key, g]) => [key, drift(want.get(key)!, g)] as const).sort((a, b) => b[1] - a[1]);
        t.diagnostic(`weights and moments: largest relative L2 drift ${drifts[0][1].toExponential(2)} (${drifts[0][0]})`);
        assert.ok(drifts[0][1] <= ORT_TOLERANCE, `${drifts[0][0]} drifted ${drifts[0][1]} (> ${ORT_TOLERANCE})`);
        for (const p of traced.model.parameters()) assert.equal(p.grad, null, 'zeroGrad in the graph left no gradient');
      });
    }
  }
});

test('a pipeline stage trains on webgpu (StageExecutor with a device): outputs, input gradients and weights after two steps of two micro-batches equal js\'s', (t) => {
  const blocks = (m: CausalLM) => m.layers.filter((l) => l.kind === 'block');
  const [a, b] = [createModel(CONFIGS.llama, { seed: 7 }), createModel(CONFIGS.llama, { seed: 7 })];
  const g = new Generator(13);
  withBackend(jsBackend, () => {
    const cpu = new StageExecutor(blocks(a), 32, { lr: 1e-2 });
    const gpu = new StageExecutor(blocks(b), 32, { lr: 1e-2, device: loadBackend('webgpu') });
    let worst = 0;
    const agree = (label: string, want: Tensor, got: Tensor) => {
      const d = drift(want.data as Float32Array, got.data as Float32Array);
      worst = Math.max(worst, d);
      assert.ok(d <= ORT_TOLERANCE, `${label}: ${d}`);
    };
    for (let step = 0; step < 2; step++) {
      for (let micro = 0; micro < 2; micro++) {
        const x = randn([2, 8, 32], { generator: g });
        agree(`step ${step} micro ${micro} output`, cpu.forward(micro, x), gpu.forward(micro, x));
        const dy = randn([2, 8, 32], { generator: g });
        agree(`step ${step} micro ${micro} input gradient`, cpu.backward(micro, dy)!, gpu.backward(micro, dy)!);
      }
      for (const [name, p] of cpu.named) agree(`step ${step} gradient of ${name}`, p.grad!, gpu.named.get(name)!.grad!);
      cpu.step(1, 1e-2);
      gpu.step(1, 1e-2);
    }
    for (const [name, p] of cpu.named) agree(`weights of ${name}`, p, gpu.named.get(name)!);
    t.diagnostic(`largest relative L2 drift ${worst.toExponential(2)}`);
  });
});

test('a stage whose steps the device refuses (a mixture\'s experts are stored in its graph) trains on the CPU instead, as js does', () => {
  const config = qwen3MoeConfig({ vocabSize: 64, hidden: 32, heads: 4, kvHeads: 2, layers: 1, maxPositions: 32, experts: 4, topK: 2 });
  const blocks = (m: CausalLM) => m.layers.filter((l) => l.kind === 'block');
  const [a, b] = [createModel(config, { seed: 8 }), createModel(config, { seed: 8 })];
  assert.match(DeviceSection.refusal(b, loadBackend('webgpu')) ?? '', /mixture/);
  withBackend(jsBackend, () => {
    const cpu = new StageExecutor(blocks(a), 32, { lr: 1e-2 });
    // given the device anyway (the worker would not): the first forward finds the refusal and goes on on the CPU
    const gpu = new StageExecutor(blocks(b), 32, { lr: 1e-2, device: loadBackend('webgpu') });
    assert.equal(gpu.deviceName, 'webgpu');
    const x = randn([2, 4, 32], { seed: 21 });
    const dy = randn([2, 4, 32], { seed: 22 });
    assert.ok(drift(cpu.forward(0, x).data as Float32Array, gpu.forward(0, x).data as Float32Array) <= ORT_TOLERANCE);
    assert.equal(gpu.deviceName, null, 'the records of what follows name the CPU context');
    assert.ok(drift(cpu.backward(0, dy)!.data as Float32Array, gpu.backward(0, dy)!.data as Float32Array) <= ORT_TOLERANCE);
  });
});
