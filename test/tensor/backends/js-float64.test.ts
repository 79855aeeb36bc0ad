// What makes the js backend the reference (its conformance, js.test.ts, is js against itself: its own bits on every
// run): every case computed in float32 lies within float32's rounding of the same case computed in float64, and the
// small cases' gradients equal float64 finite differences.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { cat, jsBackend, type Tensor, withBackend } from '../../../src/tensor/index.ts';
import { gradcheck } from '../../helpers/gradcheck.ts';
import { relErr } from '../../helpers/weights.ts';
import { CASES } from './cases.ts';
import { evaluate, inputsOf } from './suite.ts';

/** Cases that run in float64 too: not those of compact weights or time-major attention (float32 only). */
const DOUBLES = CASES.filter((c) => c.float32Only !== true);

/**
 * float32 against float64, as max |a − b| / max |b| per result: float32 rounds each value to 6e-8 of itself and the
 * kernels sum in double precision, so what remains is a few roundings along each op's chain (measured: at most 1.5e-7,
 * full attention's gradients).
 */
const FLOAT32_ROUNDING = 1e-6;

describe('js: each case in float32 is its float64 result, rounded', () => {
  for (const c of DOUBLES) {
    test(c.name, () => {
      const single = evaluate(jsBackend, c);
      const double = evaluate(jsBackend, c, 'float64');
      assert.deepEqual(single.map((r) => r.label), double.map((r) => r.label));
      single.forEach((r, i) => {
        const e = relErr(r.values, double[i].values);
        assert.ok(e <= FLOAT32_ROUNDING, `${r.label}: ${e.toExponential(2)} from float64`);
      });
    });
  }
});

/** Inputs small enough for finite differences (two runs of the op per input element). */
const SMALL = 300;

/** The case's outputs as one tensor (several are flattened and joined), for gradcheck. */
const joined = (run: (...xs: Tensor[]) => Tensor | Tensor[]) => (...xs: Tensor[]): Tensor => {
  const out = run(...xs);
  return Array.isArray(out) ? cat(out.map((o) => o.flatten()), 0) : out;
};

describe('js: gradients of the small cases against float64 finite differences', () => {
  for (const c of DOUBLES) {
    const inputs = inputsOf(c);
    const floats = inputs.filter((x) => x.dtype !== 'int32').reduce((n, x) => n + x.size, 0);
    const differentiable = evaluate(jsBackend, c).some((r) => r.label.startsWith('gradient'));
    if (c.noGrad === true || !differentiable || floats > SMALL) continue;
    test(c.name, () => {
      const { maxError } = withBackend(jsBackend, () => gradcheck(joined(c.run), inputs));
      assert.ok(maxError < 1e-6, `max relative error ${maxError}`);
    });
  }
});
