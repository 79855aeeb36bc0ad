import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { configFromHF, gpt2Config, partBytes, validateConfig } from '../../src/models/index.ts';
import { MemoryBudget } from '../../src/worker/index.ts';

describe('a worker\'s memory budget', () => {
  test('holdings are counted per job and use; growth past the budget is refused and changes nothing; a job\'s release frees all', () => {
    const budget = new MemoryBudget(100);
    budget.hold('a', 'weights', 60, 'a section');
    budget.holdAll('a', { gradients: 20, optimizer: 10 }, 'training');
    assert.equal(budget.used(), 90);
    // both or neither: 20 + 40 is more than the 10 free
    assert.throws(() => budget.holdAll('b', { 'weights': 5, 'kv-cache': 40 }, 'a second job'), { name: 'MemoryBudgetError', message: /a second job needs/ });
    assert.equal(budget.used(), 90);
    assert.equal(budget.held('b', 'weights'), 0);
    budget.add('a', 'kv-cache', 10, 'a session');
    assert.equal(budget.free(), 0);
    budget.add('a', 'kv-cache', -10, 'closing it');
    // a size that is not one (NaN from an absurd config, negative, infinite) is refused: the budget stays a number
    for (const bad of [Number.NaN, -1, Infinity]) assert.throws(() => budget.hold('a', 'activations', bad, 'x'), { name: 'MemoryBudgetError' });
    assert.equal(budget.used(), 90);
    budget.release('a');
    assert.deepEqual(budget.report(), { total: 100, used: 0, free: 100, jobs: [] });
  });

  test('a config from a peer is bounded: sizes that would overflow or exhaust memory before any budget check are refused', () => {
    assert.throws(() => validateConfig(gpt2Config({ vocabSize: 1e308, hidden: 2, heads: 1 })), { name: 'InvalidArgumentError', message: /vocabSize/ });
    assert.throws(() => configFromHF({ model_type: 'gpt2', n_embd: 8, n_layer: 5_000_000, n_head: 2, vocab_size: 10, n_positions: 8 }), { name: 'InvalidArgumentError', message: /layers is 5000000/ });
    const c = gpt2Config({ vocabSize: 4_194_304, hidden: 262_144, heads: 1, layers: 1 });
    assert.ok(Number.isFinite(partBytes(c, [0, 4])));
  });
});
