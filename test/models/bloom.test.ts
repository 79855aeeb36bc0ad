import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { alibiSlopes } from '../../src/models/alibi.ts';
import { bloomConfig, configFromHF } from '../../src/models/index.ts';
import { familyFixtureTests, smallModelTests } from '../helpers/family-checks.ts';

describe('BLOOM (ALiBi, embedding LayerNorm, fused per-head QKV)', () => {
  familyFixtureTests('bloom');
  smallModelTests('residual after the norm, untied head, 6 heads', bloomConfig({
    vocabSize: 40, hidden: 36, heads: 6, layers: 2, maxPositions: 32, residualPostNorm: true, tieWordEmbeddings: false,
  }));

  test('ALiBi slopes as transformers: geometric for a power of two, interleaved beyond', () => {
    assert.deepEqual([...alibiSlopes(4)], [0.25, 0.0625, 0.015625, 0.00390625]);
    // 6 heads: the 4 of the power of two below, then odd powers of 2^(-4/4)
    assert.deepEqual([...alibiSlopes(6)], [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]);
    // 12 heads: powers of 2^-1, then odd powers of 2^-0.5 (float32)
    const s = alibiSlopes(12);
    assert.equal(s[8], Math.fround(Math.SQRT1_2));
    assert.equal(s[9], Math.fround(Math.fround(Math.SQRT1_2) ** 3));
  });

  test('refusals name the field', () => {
    assert.throws(
      () => configFromHF({ model_type: 'bloom', vocab_size: 10, hidden_size: 8, n_layer: 1, n_head: 2, slow_but_exact: true, pretraining_tp: 2 }),
      (e: Error) => e.name === 'InvalidArgumentError' && e.message.includes('slow_but_exact'),
    );
  });
});
