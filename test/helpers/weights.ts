import assert from 'node:assert/strict';
import type { ModelConfig } from '../../src/models/index.ts';

/** max |a − b| / max |b|. */
export function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < a.length; i++) {
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return diff / Math.max(scale, 1e-30);
}

/**
 * Trained weights within 1e-5 of a reference, tensor by tensor. GPT-2's key bias (the middle
 * third of c_attn.bias) has a gradient of exactly zero, as softmax ignores a shift shared by
 * all keys: it holds only rounding noise, which Adam scales up to full steps, so any change of
 * summation order moves it. It is held to 1e-4.
 */
export function assertWeightsClose(got: Map<string, ArrayLike<number>>, ref: Map<string, ArrayLike<number>>, config: ModelConfig): void {
  const h = config.hidden;
  for (const [name, want] of ref) {
    const have = got.get(name);
    assert.ok(have, `${name} is held by some stage`);
    const keyBias = /attn\.c_attn\.bias$/.test(name);
    const cut = (v: ArrayLike<number>) => (keyBias ? [...Array.from(v).slice(0, h), ...Array.from(v).slice(2 * h)] : v);
    assert.ok(relErr(cut(have), cut(want)) <= 1e-5, `${name}: ${relErr(cut(have), cut(want))}`);
    if (keyBias) assert.ok(relErr(have, want) <= 1e-4, `${name} (key bias): ${relErr(have, want)}`);
  }
}
