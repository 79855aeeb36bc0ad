import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  type CausalLM, createModel, decodeRows, defaultPositions, type ForwardContext, gpt2Config, KVCache, llamaConfig, mixtralConfig,
  type ModelConfig,
} from '../../src/models/index.ts';
import { AdamW, Linear, type Module } from '../../src/nn/index.ts';
import { hooked } from '../../src/tensor/dispatch.ts';
import {
  type Backend,
  cat,
  type CompiledStep,
  createOrtBackend,
  crossEntropy,
  Generator,
  jsBackend,
  linear,
  noGrad,
  ortAvailable,
  randint,
  randn,
  scaledDotProductAttention,
  setBackend,
  type Tensor,
  tensor,
  trace,
  type TracedStep,
  withBackend,
} from '../../src/tensor/index.ts';

/** Bit for bit: same dtype, shape and every float's bits. */
function assertSameBits(actual: Tensor, expected: Tensor, what: string): void {
  assert.equal(actual.dtype, expected.dtype, what);
  assert.deepEqual(actual.shape, expected.shape, what);
  assert.deepEqual(new Uint8Array(actual.data.buffer, actual.data.byteOffset, actual.data.byteLength),
    new Uint8Array(expected.data.buffer, expected.data.byteOffset, expected.data.byteLength), what);
}

function block(model: CausalLM): (x: Tensor, ctx: ForwardContext) => Tensor {
  const layer = model.layers.find((l) => l.kind === 'block')!;
  return (x, ctx) => layer.forward(x, ctx);
}

describe('traced steps', () => {
  setBackend('js');
  const rng = new Generator(7);

  test('a small MLP replays bit for bit with new inputs, recording its outermost ops once', () => {
    const fc1 = new Linear(16, 32, { rng });
    const fc2 = new Linear(32, 8, { rng });
    const mlp = (x: Tensor) => fc2.forward(fc1.forward(x).gelu());
    const x0 = randn([4, 16], { generator: rng });
    const { step, output } = trace(mlp, [x0]);
    assertSameBits(output, mlp(x0), 'the traced call');
    // linear is one op (its matmul and bias inside are not recorded again)
    assert.deepEqual(step.ops.map((o) => o.op), ['linear', 'gelu', 'linear']);
    assert.deepEqual(step.slots.map((s) => s.kind), ['input', 'constant', 'constant', 'result', 'result', 'constant', 'constant', 'result']);
    for (let i = 0; i < 3; i++) {
      const x = randn([4, 16], { generator: rng });
      assertSameBits(step.run([x]), mlp(x), `run ${i}`);
    }
    // outside a trace the ops' one boolean is off again: recording costs nothing then
    assert.equal(hooked, false);
    // constants are read at each run: an update of a parameter in place is seen
    fc2.bias!.data[0] += 1;
    const x = randn([4, 16], { generator: rng });
    assertSameBits(step.run([x]), mlp(x), 'after an update');
  });

  test('a replay records autograd as a call does: the same gradients', () => {
    const w = randn([6, 5], { generator: rng });
    w.requiresGrad = true;
    const f = (x: Tensor) => linear(x, w).tanh().sum();
    const { step } = trace(f, [randn([3, 5], { generator: rng })]);
    const x = randn([3, 5], { generator: rng });
    f(x).backward();
    const direct = w.grad!.data.slice();
    w.grad = null;
    step.run([x]).backward();
    assert.deepEqual(w.grad!.data, direct);
  });

  test('a decoding step with its KV cache as inputs and outputs', () => {
    const [heads, dim, hidden, past] = [2, 4, 8, 3];
    const wq = randn([hidden, hidden], { generator: rng });
    const wk = randn([hidden, hidden], { generator: rng });
    const wv = randn([hidden, hidden], { generator: rng });
    const heads4 = (t: Tensor) => t.reshape([1, 1, heads, dim]).transpose(1, 2); // [1, nh, 1, hd]
    const decode = (x: Tensor, pastK: Tensor, pastV: Tensor): Tensor[] => {
      const k = cat([pastK, heads4(linear(x, wk))], 2); // [1, nh, T + 1, hd]
      const v = cat([pastV, heads4(linear(x, wv))], 2);
      const y = scaledDotProductAttention(heads4(linear(x, wq)), k, v, { causal: true });
      return [y.transpose(1, 2).reshape([1, 1, hidden]), k.narrow(2, 1, past), v.narrow(2, 1, past)];
    };
    const cache = () => randn([1, heads, past, dim], { generator: rng });
    const inputs = () => [randn([1, 1, hidden], { generator: rng }), cache(), cache()];
    const { step } = noGrad(() => trace(decode, inputs()));
    // the window slides: each step's cache outputs are the next step's inputs
    let [x, k, v] = inputs();
    for (let i = 0; i < 4; i++) {
      const replayed = noGrad(() => step.run([x, k, v]));
      const direct = noGrad(() => decode(x, k, v));
      replayed.forEach((t, j) => assertSameBits(t, direct[j], `step ${i} output ${j}`));
      [x, k, v] = [randn([1, 1, hidden], { generator: rng }), replayed[1], replayed[2]];
    }
  });

  for (const [arch, config] of [
    ['gpt2', gpt2Config({ layers: 2, hidden: 32, heads: 4, vocabSize: 64, maxPositions: 32 })],
    ['llama', llamaConfig({ layers: 2, hidden: 32, heads: 4, kvHeads: 2, intermediate: 48, vocabSize: 64, maxPositions: 32 })],
  ] as const) {
    test(`a ${arch} block's forward replays bit for bit with new hidden states`, () => {
      const model = createModel(config, { seed: 3 });
      const forward = block(model);
      const ctx: ForwardContext = { positions: defaultPositions(2, 5, 0), keyMask: null, cache: null };
      const { step } = noGrad(() => trace((x: Tensor) => forward(x, ctx), [randn([2, 5, 32], { generator: rng })]));
      assert.ok(step.ops.length > 5, `${step.ops.length} ops`);
      for (let i = 0; i < 2; i++) {
        const x = randn([2, 5, 32], { generator: rng });
        assertSameBits(noGrad(() => step.run([x])), noGrad(() => forward(x, ctx)), `run ${i}`);
      }
    });

    test(`a whole ${arch} forward replays bit for bit with new token ids`, () => {
      const model = createModel(config, { seed: 4 });
      const ids = () => randint(0, 64, [1, 6], { generator: rng });
      const { step } = noGrad(() => trace((x: Tensor) => model.forward(x), [ids()]));
      const x = ids();
      assertSameBits(noGrad(() => step.run([x])), noGrad(() => model.forward(x)), 'logits');
    });
  }

  /** A small mixture of experts: 2 of 4 experts per token. */
  const mixtral = mixtralConfig({
    vocabSize: 40, hidden: 32, heads: 4, kvHeads: 2, layers: 2, maxPositions: 32, experts: 4, topK: 2, intermediate: 16,
  });

  test('a mixture of experts block replays its routing: the experts the new tokens pick, bit for bit', () => {
    const forward = block(createModel(mixtral, { seed: 5 }));
    const ctx: ForwardContext = { positions: defaultPositions(2, 5, 0), keyMask: null, cache: null };
    const { step } = noGrad(() => trace((x: Tensor) => forward(x, ctx), [randn([2, 5, 32], { generator: rng })]));
    // the routed experts are one op: a replay picks them again from its own router probabilities
    assert.ok(step.ops.some((o) => o.op === 'routedExperts'), step.ops.map((o) => o.op).join());
    for (let i = 0; i < 3; i++) {
      const x = randn([2, 5, 32], { generator: rng });
      assertSameBits(noGrad(() => step.run([x])), noGrad(() => forward(x, ctx)), `run ${i}`);
    }
    // with gradients too: the replay's routed experts take them as a call's do
    const x = randn([2, 5, 32], { generator: rng });
    const { step: trained } = trace((h: Tensor) => forward(h, ctx), [x]);
    assertSameBits(trained.run([x]), forward(x, ctx), 'with gradients');
  });

  for (const [arch, config] of [
    ['llama', llamaConfig({ layers: 2, hidden: 32, heads: 4, kvHeads: 2, intermediate: 48, vocabSize: 64, maxPositions: 32 })],
    ['mixtral', mixtral],
    ['gpt2', gpt2Config({ layers: 2, hidden: 32, heads: 4, vocabSize: 64, maxPositions: 32 })],
  ] as [string, ModelConfig][]) {
    test(`a ${arch} decoding step without gradients replays with another token and another cache, and returns the grown cache`, () => {
      const model = createModel(config, { seed: 6 });
      const layer = model.layers.find((l) => l.kind === 'block')!;
      const [kvHeads, dim, past] = [arch === 'gpt2' ? 4 : 2, 8, 6];
      // one token after `past` cached ones: its output and the layer's cache grown by it, as a decoding step leaves it
      const decode = (x: Tensor, pastK: Tensor, pastV: Tensor): Tensor[] => {
        const cache = new KVCache(config.layers);
        cache.layers[layer.blockIndex] = { k: pastK, v: pastV };
        const y = layer.forward(x, { positions: defaultPositions(1, 1, past), keyMask: null, cache });
        const grown = cache.layers[layer.blockIndex]!;
        return [y, grown.k, grown.v];
      };
      const cached = () => randn([1, kvHeads, past, dim], { generator: rng });
      const inputs = () => [randn([1, 1, 32], { generator: rng }), cached(), cached()];
      const { step } = noGrad(() => trace(decode, inputs()));
      for (let i = 0; i < 2; i++) {
        const [x, k, v] = inputs();
        const replayed = noGrad(() => step.run([x, k, v]));
        const direct = noGrad(() => decode(x, k, v)); // the cache grown in place, the fused step where it applies
        assert.deepEqual(replayed[1].shape, [1, kvHeads, past + 1, dim]);
        replayed.forEach((t, j) => assertSameBits(t, direct[j], `run ${i} output ${j}`));
      }
    });
  }

  const ort = { skip: !ortAvailable() };
  test('on a backend with fused products, a traced decoding step records ops, not the fused step or stacked rows', ort, () => {
    const config = llamaConfig({ layers: 2, hidden: 32, heads: 4, kvHeads: 2, intermediate: 48, vocabSize: 64, maxPositions: 32 });
    const past = 5;
    const cached = () => randn([1, 2, past, 8], { generator: rng });
    const row = (x: Tensor, k: Tensor, v: Tensor) => {
      const cache = new KVCache(config.layers);
      cache.layers[0] = { k, v };
      return { x, cache, positions: defaultPositions(1, 1, past) };
    };
    // two sequences' steps through a section's first block: decodeRows stacks them (and each takes decode-step.ts) outside a trace
    const section = createModel(config, { seed: 8, section: [1, 2] });
    const decode = (x1: Tensor, k1: Tensor, v1: Tensor, x2: Tensor, k2: Tensor, v2: Tensor): Tensor[] => {
      const rows = [row(x1, k1, v1), row(x2, k2, v2)];
      return [...decodeRows(section, rows), ...rows.flatMap((r) => [r.cache.layers[0]!.k, r.cache.layers[0]!.v])];
    };
    const inputs = () => [0, 1].flatMap(() => [randn([1, 1, 32], { generator: rng }), cached(), cached()]);
    withBackend(createOrtBackend({ threads: 1, minMacs: 0 }), () => {
      const { step } = noGrad(() => trace(decode, inputs()));
      assert.ok(step.ops.filter((o) => o.op === 'cat').length >= 4, step.ops.map((o) => o.op).join());
      for (let i = 0; i < 2; i++) {
        const xs = inputs();
        const replayed = noGrad(() => step.run(xs));
        const direct = noGrad(() => decode(...(xs as [Tensor, Tensor, Tensor, Tensor, Tensor, Tensor])));
        replayed.forEach((t, j) => assertSameBits(t, direct[j], `run ${i} output ${j}`));
      }
    });
  });

  /** Every parameter's bits, by name. */
  const weights = (m: Module) =>
    [...m.namedParameters()].map(([name, p]) => [name, Array.from(new Uint32Array(p.data.buffer, p.data.byteOffset, p.size))]);
  /** An optimizer's state of one parameter, comparable. */
  const moments = (s: Record<string, Float32Array | number> | undefined) =>
    Object.entries(s ?? {}).map(([k, v]) => [k, v instanceof Float32Array ? Array.from(v) : v]);

  test('a whole training step (forward, loss, backward, AdamW step, zeroGrad) replays bit for bit: losses, weights and moments', () => {
    const config = gpt2Config({ layers: 2, hidden: 32, heads: 4, vocabSize: 64, maxPositions: 32 });
    const direct = createModel(config, { seed: 5 });
    const traced = createModel(config, { seed: 5 });
    const ids = () => randint(0, 64, [2, 6], { generator: rng });
    const batches = Array.from({ length: 4 }, () => [ids(), ids()]);
    const stepOf = (model: CausalLM) => {
      const opt = new AdamW(model.parameters(), { lr: 1e-2, weightDecay: 0.1 });
      return { opt, run: (ids: Tensor, targets: Tensor): Tensor => {
        const loss = crossEntropy(model.forward(ids), targets);
        loss.backward();
        opt.step();
        opt.zeroGrad();
        return loss;
      } };
    };
    const a = stepOf(direct);
    const b = stepOf(traced);
    const directLosses = batches.map(([ids, targets]) => a.run(ids, targets).item());
    const { step, output } = trace(b.run, batches[0]);
    const names = step.ops.map((o) => o.op);
    for (const op of ['backward', 'optimizerStep', 'zeroGrad']) assert.equal(names.filter((n) => n === op).length, 1, `${op} once in ${names.join(' ')}`);
    const tracedLosses = [output.item(), ...batches.slice(1).map((inputs) => step.run(inputs).item())];
    assert.deepEqual(tracedLosses, directLosses);
    assert.notDeepEqual(weights(direct), weights(createModel(config, { seed: 5 })), 'the steps moved the weights');
    assert.deepEqual(weights(traced), weights(direct));
    for (const [i, p] of traced.parameters().entries()) {
      assert.deepEqual(moments(b.opt.getState(p)), moments(a.opt.getState(direct.parameters()[i])), `AdamW state of parameter ${i}`);
      assert.equal(p.grad, null, 'zeroGrad replayed');
    }
  });

  test('what a trace cannot record is a typed error', () => {
    assert.throws(() => trace((x: Tensor) => tensor([x.sum().item()]), [randn([2], { generator: rng })]), { name: 'TraceError' });
    assert.throws(() => trace((x: Tensor) => trace((y: Tensor) => y.exp(), [x]).output, [randn([2], { generator: rng })]), { name: 'TraceError' });
    const x = randn([2], { generator: rng });
    assert.throws(() => trace((a: Tensor, b: Tensor) => a.add(b), [x, x]), { name: 'TraceError' });
    assert.throws(() => trace(async (a: Tensor) => a.exp(), [x]), { name: 'TraceError' });
    const { step } = trace((a: Tensor) => a.exp(), [x]);
    assert.throws(() => step.run([randn([3], { generator: rng })]), { name: 'TraceError' });
    assert.throws(() => step.run([]), { name: 'TraceError' });
    // reading a tensor the trace did not compute (a setting, a parameter) is fine
    const scale = tensor([2]);
    assert.doesNotThrow(() => trace((a: Tensor) => a.mul(scale.item()), [x]));
  });

  test('a backend may take the whole step (compileStep), once per step', () => {
    const w = randn([4, 4], { generator: rng });
    const f = (x: Tensor) => linear(x, w).relu();
    const { step } = trace(f, [randn([2, 4], { generator: rng })]);
    let compiles = 0;
    let runs = 0;
    const whole: Backend = {
      ...jsBackend,
      name: 'whole-step',
      compileStep(s: TracedStep): CompiledStep {
        compiles++;
        assert.equal(s, step);
        assert.equal(s.outputSlots.length, 1);
        // a program of its own: here, the ops replayed under js by hand
        return {
          run(inputs) {
            runs++;
            const values: (Tensor | undefined)[] = [];
            inputs.forEach((t, i) => (values[i] = t));
            s.slots.forEach((slot, i) => slot.kind === 'constant' && (values[i] = slot.tensor!));
            for (const op of s.ops) {
              const out = op.run(...op.args.map((a) => (a instanceof Object && 'slot' in a ? values[(a as { slot: number }).slot] : a))) as Tensor;
              values[op.outputSlots[0]] = out;
            }
            return s.outputSlots.map((i) => values[i]!);
          },
        };
      },
    };
    for (let i = 0; i < 3; i++) {
      const x = randn([2, 4], { generator: rng });
      assertSameBits(withBackend(whole, () => step.run([x])), f(x), `run ${i}`);
    }
    assert.deepEqual([compiles, runs], [1, 3]);
  });
});
