// Issue #30: models held in compact formats. Every transformers fixture loaded at bf16, int8 and int4 against itself at
// float32 (the measure: the largest absolute difference of the logits over their largest absolute value), the
// bytes held, and the whole `generate --quantize int4` process of a 48M Llama against the same generation at f32.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { compactWeight, loadModel, saveModel } from '../../src/models/index.ts';
import { modelInMemory } from '../../src/user/user-model.ts';
import { hashTensors } from '../../src/verify/index.ts';
import { formatBytes, packedBytes, setBackend, type WeightFormat } from '../../src/tensor/index.ts';
import { hfFixtureNames, readHFReference } from '../helpers/hf-fixtures.ts';
import { relErr } from '../helpers/weights.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
const PEAK = fileURLToPath(new URL('../helpers/peak-rss-on-exit.mjs', import.meta.url));
const MOE = new Set(['mixtral', 'qwen3_moe']);
/**
 * Bounds on the dense fixtures, over what was measured (bf16 ≤ 1.2e-2, int8 ≤ 3.0e-2, int4 ≤ 4.3e-1): their weights
 * have the spread 1/√fan_in, on 64 dims, so even bf16's rounding moves the largest logit by 1%. (The issue hoped for
 * int8 within 2%: five of the thirteen dense fixtures are above it, with llama.cpp's own Q8_0 values; by ‖Δ‖/‖logits‖,
 * printed beside it, llama 2.1% and phi3 2.0%.) Q8_0 of one class of matrix alone (embedding, head, attention, MLP)
 * gives 0.3–1.9% each, so the error is 8-bit rounding spread over every matrix, not one weak tensor: keeping the
 * embedding and head in float32 leaves llama at 2.45%, and the block scale of least squared error (valid Q8_0 bytes,
 * 13% less weight error, about 30× the packing time) at 2.6%; both together, 2.0%. Neither is llama.cpp's Q8_0.
 */
const BOUND: Record<WeightFormat, number> = { bf16: 0.015, int8: 0.035, int4: 0.5 };

describe('the transformers fixtures held compact', () => {
  setBackend('js');
  for (const name of hfFixtureNames()) {
    test(name, async () => {
      const ref = readHFReference(name);
      const f32 = await loadModel(ref.dir);
      const dense = f32.forward(ref.inputIds).data;
      const floatBytes = [...f32.hfStateDict()].reduce((n, [k, t]) => n + (compactWeight(k, t.shape) ? 4 * t.size : 0), 0);
      const row = [name.padEnd(20)];
      for (const format of ['bf16', 'int8', 'int4'] as WeightFormat[]) {
        const model = await loadModel(ref.dir, format === 'bf16' ? { dtype: 'bf16' } : { quantize: format });
        let held = 0;
        for (const [key, t] of model.hfStateDict()) {
          // every matrix but a router is packed (and frozen); norms, biases and routers stay float32
          assert.equal(t.packed !== null, compactWeight(key, t.shape), `${name}: ${key}`);
          if (!t.packed) continue;
          assert.equal(t.packed.format, format);
          assert.equal(t.requiresGrad, false, `${key} is frozen`);
          held += packedBytes(t.packed);
          assert.equal(packedBytes(t.packed), formatBytes(format, t.shape[0], t.shape[1]));
        }
        const logits = model.forward(ref.inputIds).data;
        const err = relErr(logits, dense);
        row.push(`${format} ${err.toExponential(2)} (L2 ${relL2(logits, dense).toExponential(2)}, ${(held / floatBytes).toFixed(3)} of the bytes)`);
        // a MoE's router picks other experts when its input moves: its error is reported, not bounded
        if (!MOE.has(name)) assert.ok(err < BOUND[format], `${name} at ${format}: logits ${err}`);
      }
      process.stderr.write(`${row.join('  ')}\n`);
    });
  }
});

/** ‖a − b‖ / ‖b‖: the logits' error over all of them, beside relErr's largest one. */
function relL2(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d2 = 0;
  let b2 = 0;
  for (let i = 0; i < a.length; i++) {
    d2 += (a[i] - b[i]) ** 2;
    b2 += b[i] ** 2;
  }
  return Math.sqrt(d2 / Math.max(b2, 1e-30));
}

describe('a model held compact, elsewhere in the project', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-compact-save-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('saved, it is the float32 values it computes with; hashed, its packed bytes; distributed, from its directory only', async () => {
    setBackend('js');
    const ref = readHFReference('qwen2');
    const int8 = await loadModel(ref.dir, { quantize: 'int8' });
    await saveModel(int8, dir);
    assert.deepEqual((await loadModel(dir)).forward(ref.inputIds).data, int8.forward(ref.inputIds).data);
    const int4 = await loadModel(ref.dir, { quantize: 'int4' });
    const name = 'model.layers.0.mlp.up_proj.weight';
    const [a, b] = [int8.hfStateDict().get(name)!, int4.hfStateDict().get(name)!];
    assert.notEqual(hashTensors([a]), hashTensors([b]), 'a record names the packed bytes, not the empty float32 buffer');
    assert.equal(hashTensors([a]), hashTensors([(await loadModel(ref.dir, { quantize: 'int8' })).hfStateDict().get(name)!]));
    assert.throws(() => modelInMemory(int8), /from its checkpoint directory/);
  });
});

describe('generate --quantize int4: the whole process against the same generation at f32', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-compact-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  // On js (the exact backend, a validator's): onnxruntime keeps its own prepacked copy of each int4 weight beside ours,
  // which brings the same ratio to 0.58–0.70 on ort (see issue #30's note); that one is measured by the benchmark.
  test('a 48M Llama of init-model, on js: the same command peaks at ≤ 0.6× the resident memory', () => {
    const init = spawnSync(process.execPath, [BIN, 'init-model', '--arch', 'llama', '--layers', '10', '--hidden', '512', '--heads', '8',
      '--kv-heads', '8', '--intermediate', '1376', '--vocab', '32000', '--out', dir, '--force'], { encoding: 'utf8' });
    assert.equal(init.status, 0, init.stderr);
    const run = (...extra: string[]) => {
      const r = spawnSync(process.execPath, ['--import', PEAK, BIN, 'generate', '--model', dir, '--prompt', 'a',
        '--max-new-tokens', '2', '--json', '--backend', 'js', ...extra], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      return { tokens: JSON.parse(r.stdout).tokens as number[], peak: Number(/peak-rss (\d+)/.exec(r.stderr)![1]) };
    };
    const f32 = run();
    const int4 = run('--quantize', 'int4');
    const ratio = int4.peak / f32.peak;
    process.stderr.write(`peak resident: f32 ${(f32.peak / 2 ** 20).toFixed(0)} MiB, int4 ${(int4.peak / 2 ** 20).toFixed(0)} MiB: ${ratio.toFixed(2)}×\n`);
    assert.equal(int4.tokens.length, 2);
    assert.notDeepEqual(f32.tokens, []);
    assert.ok(ratio <= 0.6, `int4 peaks at ${ratio.toFixed(2)}× the f32 process`);
  });
});
