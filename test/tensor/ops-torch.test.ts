import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { setBackend, Tensor } from '../../src/tensor/index.ts';
import { decode, type Encoded, loadFixture, relError } from '../helpers/fixtures.ts';
import { gradcheck } from '../helpers/gradcheck.ts';
import { opCases } from '../helpers/op-cases.ts';

interface OpFixture {
  inputs: Encoded[];
  output: Encoded;
  weight: Encoded;
  grads: (Encoded | null)[];
}

const fixture = loadFixture<{ torch: string; cases: Record<string, OpFixture> }>('torch-ops.json');

describe(`ops against PyTorch ${fixture.torch} fixtures (js backend)`, () => {
  setBackend('js');
  test('every fixture case has an engine implementation and vice versa', () => {
    assert.deepEqual(Object.keys(fixture.cases).sort(), Object.keys(opCases).sort());
  });
  for (const [name, c] of Object.entries(fixture.cases)) {
    test(name, () => {
      const inputs = c.inputs.map((e) => {
        const t = decode(e);
        if (t.dtype !== 'int32') t.requiresGrad = true;
        return t;
      });
      const out = opCases[name](...inputs);
      assert.deepEqual([...out.shape], c.output.shape, 'output shape');
      assert.ok(relError(out, c.output.data) < 1e-5, `output error ${relError(out, c.output.data)}`);
      out.mul(decode(c.weight)).sum().backward();
      c.grads.forEach((g, i) => {
        if (g === null) return;
        const mine = inputs[i].grad;
        assert.ok(mine instanceof Tensor, `input ${i} has a gradient`);
        const err = relError(mine, g.data);
        assert.ok(err < 1e-5, `grad ${i} error ${err}`);
      });
    });
  }
});

describe('op gradients against float64 finite differences', () => {
  setBackend('js');
  for (const [name, c] of Object.entries(fixture.cases)) {
    test(name, () => {
      const inputs = c.inputs.map((e) => decode(e, 'float64'));
      const { maxError } = gradcheck(opCases[name], inputs);
      assert.ok(maxError < 1e-6, `max relative error ${maxError}`);
    });
  }
});
