import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { decodeRows, type DecodeRow } from '../../src/models/generation/decode-batch.ts';
import { type CausalLM, createModel, gpt2Config, KVCache, llamaConfig } from '../../src/models/index.ts';
import { DecoderBlock } from '../../src/models/decoder.ts';
import { createOrtBackend, noGrad, ortAvailable, packWeight, tensor, type Tensor, withBackend } from '../../src/tensor/index.ts';
import { drift, ORT_TOLERANCE, ortTolerance } from '../../src/verify/compare.ts';

const VOCAB = 64;
/** Prompts of different lengths: the rows' caches and positions differ. */
const PROMPTS = [[3, 17, 42], [5], [9, 60, 1, 22, 8, 30, 11], [40, 2], [7, 7, 7, 7, 7]];
const NEXT = [[12, 4, 50], [33, 21, 6], [2, 2, 19], [61, 0, 15], [27, 44, 3]];

function llama(extra: Partial<Parameters<typeof llamaConfig>[0]> = {}) {
  return llamaConfig({ vocabSize: VOCAB, hidden: 64, layers: 2, heads: 4, kvHeads: 2, intermediate: 96, maxPositions: 64, ...extra });
}

function frozen(model: CausalLM, format: 'int8' | 'int4' | null = null): CausalLM {
  for (const p of model.parameters()) p.requiresGrad = false;
  if (format) for (const [name, t] of model.hfStateDict()) if (t.ndim === 2 && !name.includes('norm')) packWeight(t, format);
  return model;
}

/** One row's own step. */
function single(model: CausalLM, row: DecodeRow): Tensor {
  return model.forward(row.x, { cache: row.cache, positions: row.positions });
}

/** Each prompt's prefill, then its next tokens: one at a time on its own (single) or all rows' steps together (batched). */
function decode(model: CausalLM, batched: boolean): Float32Array[][] {
  return noGrad(() => {
    const caches = PROMPTS.map((p) => {
      const cache = new KVCache(model.config.layers);
      model.forward(tensor(p, [1, p.length], 'int32'), { cache });
      return cache;
    });
    const out: Float32Array[][] = PROMPTS.map(() => []);
    for (let s = 0; s < NEXT[0].length; s++) {
      const rows: DecodeRow[] = PROMPTS.map((p, r) => ({
        x: tensor([NEXT[r][s]], [1, 1], 'int32'), cache: caches[r], positions: tensor([p.length + s], [1, 1], 'int32'),
      }));
      const ys: Tensor[] = batched ? decodeRows(model, rows) : rows.map((row) => single(model, row));
      ys.forEach((y, r) => out[r].push(y.data as Float32Array));
    }
    return out;
  });
}

describe('batched decoding steps of rows with their own caches (decode-batch.ts)', () => {
  test('on js every row equals its own forward bit for bit (f32, int8, int4)', (t) => {
    // the blocks were batched, not run row by row: every row of every step planned
    const plan = t.mock.method(DecoderBlock.prototype, 'decodePlan');
    withBackend('js', () => {
      for (const format of [null, 'int8', 'int4'] as const) {
        const model = frozen(createModel(llama(), { seed: 5 }), format);
        const single = decode(model, false);
        const planned = plan.mock.calls.length;
        const batched = decode(model, true);
        const plans = plan.mock.calls.slice(planned).map((c) => c.result);
        assert.equal(plans.length, PROMPTS.length * NEXT[0].length * 2);
        assert.ok(plans.every((p) => p !== null), 'every row planned');
        single.forEach((steps, r) => steps.forEach((y, s) => assert.deepEqual(batched[r][s], y, `${format ?? 'f32'} row ${r} step ${s}`)));
      }
    });
  });

  test('on js, a section of blocks (hidden states in and out), a sliding window some rows pass, and a model it cannot batch', () => {
    withBackend('js', () => {
      const whole = frozen(createModel(llama(), { seed: 6 }));
      const section = frozen(createModel(llama(), { seed: 6, section: [1, 3] }));
      section.loadStateDict(whole.hfStateDict(), { strict: false });
      const run = (model: CausalLM, batched: boolean) => noGrad(() => {
        const caches = PROMPTS.map(() => new KVCache(2));
        const hidden = (r: number, s: number) => tensor(Array.from({ length: 64 }, (_, j) => Math.sin(r * 7 + s * 3 + j)), [1, 1, 64]);
        const out: Float32Array[] = [];
        for (let s = 0; s < 4; s++) {
          const rows = PROMPTS.map((_, r) => ({ x: hidden(r, s), cache: caches[r], positions: tensor([s], [1, 1], 'int32') }));
          const ys = batched ? decodeRows(model, rows) : rows.map((row) => single(model, row));
          out.push(...ys.map((y) => y.data as Float32Array));
        }
        return out;
      });
      const a = run(section, false);
      assert.deepEqual(run(section, true), a, 'a section of blocks');
      // Mistral's window of 4: rows whose cache passes it run their block alone, the others together
      const mistral = frozen(createModel(llama({ modelType: 'mistral', slidingWindow: 4 }), { seed: 7 }));
      const ms = decode(mistral, false);
      decode(mistral, true).forEach((steps, r) => steps.forEach((y, s) => assert.deepEqual(y, ms[r][s], `mistral row ${r} step ${s}`)));
      // a family without Llama blocks: each row's own forward
      const gpt2 = frozen(createModel(gpt2Config({ vocabSize: VOCAB, hidden: 32, layers: 2, heads: 4, maxPositions: 64 }), { seed: 8 }));
      const gs = decode(gpt2, false);
      decode(gpt2, true).forEach((steps, r) => steps.forEach((y, s) => assert.deepEqual(y, gs[r][s], `gpt2 row ${r} step ${s}`)));
    });
  });

  test('on ort every row is its own forward within float tolerance (f32, int4)', { skip: !ortAvailable() }, () => {
    withBackend(createOrtBackend({ threads: 1, minMacs: 0 }), () => {
      for (const format of [null, 'int4'] as const) {
        const model = frozen(createModel(llama({ hidden: 128, intermediate: 192 }), { seed: 9 }), format);
        const single = decode(model, false);
        const batched = decode(model, true);
        let worst = 0;
        single.forEach((steps, r) => steps.forEach((y, s) => (worst = Math.max(worst, drift(y, batched[r][s])))));
        const tolerance = format ? ortTolerance(format) : ORT_TOLERANCE;
        assert.ok(worst <= tolerance, `${format ?? 'f32'}: drift ${worst} over ${tolerance}`);
        console.log(`ort ${format ?? 'f32'}: batched vs single drift ${worst.toExponential(2)}`);
      }
    });
  });
});
