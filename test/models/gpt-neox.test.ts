import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { configFromHF, configToHF, gptNeoXConfig } from '../../src/models/index.ts';
import { tensor } from '../../src/tensor/index.ts';
import { erf, geluErf } from '../../src/tensor/ops/gelu-erf.ts';
import { familyFixtureTests, smallModelTests } from '../helpers/family-checks.ts';

describe('GPT-NeoX (parallel residual, partial rotary, fused per-head QKV, embed_out)', () => {
  familyFixtureTests('gpt_neox');
  smallModelTests('sequential residual, tied head, tanh GELU', gptNeoXConfig({
    vocabSize: 40, hidden: 32, heads: 2, layers: 2, maxPositions: 32, parallelResidual: false, tieWordEmbeddings: true, hiddenAct: 'gelu_new', rotaryPct: 0.5,
  }));

  test('the exact GELU: erf to double precision, its derivative by finite differences', () => {
    const known: [number, number][] = [
      [0.1, 0.1124629160182849], [0.5, 0.5204998778130465], [1, 0.8427007929497149],
      [2, 0.9953222650189527], [3, 0.9999779095030014], [4.5, 0.9999999998033839],
    ];
    for (const [x, want] of known) {
      assert.ok(Math.abs(erf(x) - want) < 1e-15, `erf(${x}) = ${erf(x)}`);
      assert.ok(Math.abs(erf(-x) + want) < 1e-15, `erf(-${x})`);
    }
    const xs = [-5, -2.5, -1, -0.3, 0, 0.2, 0.9, 1.1, 2, 3.3, 7];
    const x = tensor(new Float64Array(xs), [xs.length], 'float64');
    x.requiresGrad = true;
    const y = geluErf(x);
    y.sum().backward();
    const f = (v: number) => 0.5 * v * (1 + erf(v / Math.SQRT2));
    xs.forEach((v, i) => {
      assert.ok(Math.abs(y.data[i] - f(v)) < 1e-15);
      const fd = (f(v + 1e-6) - f(v - 1e-6)) / 2e-6;
      assert.ok(Math.abs(x.grad!.data[i] - fd) < 1e-8, `gelu'(${v}) = ${x.grad!.data[i]}, finite differences ${fd}`);
    });
  });

  test('rope scalings of config.json (rope.ts) on the rotated dims, round-tripped', () => {
    const raw = { model_type: 'gpt_neox', vocab_size: 10, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, rotary_pct: 0.5 };
    for (const rope_scaling of [{ type: 'linear', factor: 2 }, { rope_type: 'dynamic', factor: 4 }]) {
      const c = configFromHF({ ...raw, rope_scaling });
      assert.ok(c.arch === 'gpt_neox' && c.ropeScaling?.factor === rope_scaling.factor);
      assert.deepEqual(configFromHF(JSON.parse(JSON.stringify(configToHF(c)))), c);
    }
  });

  test('refusals name the field', () => {
    const base = { model_type: 'gpt_neox', vocab_size: 10, hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 2 };
    const refused = (extra: Record<string, unknown>, word: string) =>
      assert.throws(() => configFromHF({ ...base, ...extra }), (e: Error) => e.name === 'InvalidArgumentError' && e.message.includes(word) && !e.message.includes('\n'));
    refused({ rope_scaling: { type: 'hyperbolic', factor: 2 } }, 'hyperbolic');
    refused({ hidden_act: 'relu' }, 'hidden_act');
    refused({ rotary_pct: 0.75 }, 'rotary_pct'); // 3 of 4 dims: odd
  });
});
