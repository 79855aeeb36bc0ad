import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { configFromHF, falconConfig } from '../../src/models/index.ts';
import { familyFixtureTests, smallModelTests } from '../helpers/family-checks.ts';

describe('Falcon (new decoder architecture: parallel attention and MLP, GQA, fused QKV; and multi-query)', () => {
  familyFixtureTests('falcon');
  smallModelTests('multi-query (Falcon-7B layout)', falconConfig({ vocabSize: 40, hidden: 32, heads: 4, layers: 2, maxPositions: 32 }));
  smallModelTests('new architecture with one norm, biases, untied head', falconConfig({
    vocabSize: 40, hidden: 32, heads: 4, kvHeads: 1, layers: 2, maxPositions: 32,
    newDecoderArchitecture: true, parallelNorms: 1, bias: true, tieWordEmbeddings: false,
  }));

  test('the multi-query config reads as one key/value head and input_layernorm', () => {
    const c = configFromHF({ model_type: 'falcon', vocab_size: 10, hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 2 });
    assert.equal(c.arch === 'falcon' && c.kvHeads, 1);
    assert.equal(c.arch === 'falcon' && c.parallelNorms, 1);
  });

  test('refusals name the field', () => {
    const base = { model_type: 'falcon', vocab_size: 10, hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 2 };
    const refused = (extra: Record<string, unknown>, word: string) =>
      assert.throws(() => configFromHF({ ...base, ...extra }), (e: Error) => e.name === 'InvalidArgumentError' && e.message.includes(word) && !e.message.includes('\n'));
    refused({ alibi: true }, 'alibi');
    refused({ parallel_attn: false }, 'parallel_attn');
    refused({ multi_query: false }, 'multi_query');
    refused({ rope_scaling: { rope_type: 'hyperbolic', factor: 2.0 } }, 'hyperbolic');
    refused({ activation: 'relu' }, 'activation');
  });
});
