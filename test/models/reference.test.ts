import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { readSafetensors, writeSafetensors } from '../../src/io/index.ts';
import { generate, loadModel, saveModel } from '../../src/models/index.ts';
import { crossEntropy, setBackend, tensor, type Tensor, zeros } from '../../src/tensor/index.ts';
import { relErr } from '../helpers/weights.ts'; // max |a − b| / max |b|: the measure

const fixtureDir = (name: string) => fileURLToPath(new URL(`../fixtures/models/${name}`, import.meta.url));

for (const name of ['gpt2-tiny', 'llama-tiny', 'qwen2-tiny']) {
  describe(`${name} against the PyTorch reference`, () => {
    setBackend('js');
    const dir = fixtureDir(name);
    const expected = readSafetensors(join(dir, 'expected.safetensors'));
    const meta = JSON.parse(readFileSync(join(dir, 'expected.json'), 'utf8')) as { loss: number; prompt: number[]; greedy: number[] };
    const ids = expected.get('input_ids')!;

    test('logits match within 1e-4 of the largest logit, gradients within 1e-3', async () => {
      const model = await loadModel(dir);
      const logits = model.forward(ids);
      const ref = expected.get('logits')!;
      assert.deepEqual([...logits.shape], [...ref.shape]);
      assert.ok(relErr(logits.data, ref.data) < 1e-4, `logits ${relErr(logits.data, ref.data)}`);
      const [b, t] = logits.shape;
      const targets = tensor(
        Array.from({ length: b * t }, (_, i) => (i % t === t - 1 ? -100 : ids.data[i + 1])),
        [b, t],
        'int32',
      );
      const loss = crossEntropy(logits, targets);
      assert.ok(Math.abs(loss.item() - meta.loss) / meta.loss < 1e-5, `loss ${loss.item()} vs ${meta.loss}`);
      loss.backward(undefined, { releaseActivations: true });
      let checked = 0;
      for (const [key, p] of model.namedParameters()) {
        const g = expected.get(`grad.${key}`);
        assert.ok(g, `PyTorch has a gradient for ${key}`);
        assert.ok(relErr(p.grad!.data, g.data) < 1e-3, `${key}: ${relErr(p.grad!.data, g.data)}`);
        checked++;
      }
      assert.equal(checked, [...expected.keys()].filter((k) => k.startsWith('grad.')).length);
    });

    test('greedy continuation equals PyTorch (cached decoding)', async () => {
      const model = await loadModel(dir);
      const { tokens } = await generate(model, meta.prompt, { maxNewTokens: meta.greedy.length, stopTokens: [] });
      assert.deepEqual(tokens, meta.greedy);
    });

    test('save → load round-trips bit for bit', async () => {
      const model = await loadModel(dir);
      const out = mkdtempSync(join(tmpdir(), 'tl-model-'));
      await saveModel(model, out, { maxShardBytes: 40_000 });
      const back = await loadModel(out);
      for (const [k, p] of model.hfStateDict()) assert.deepEqual(back.hfStateDict().get(k)!.data, p.data, k);
      assert.deepEqual(back.forward(ids).data, model.forward(ids).data);
    });
  });
}

describe('checkpoint variants and errors', () => {
  test('GPT-2 checkpoints without the transformer. prefix and with attn.bias buffers load', async () => {
    const src = fixtureDir('gpt2-tiny');
    const dir = mkdtempSync(join(tmpdir(), 'tl-gpt2-old-'));
    writeFileSync(join(dir, 'config.json'), readFileSync(join(src, 'config.json')));
    const old = new Map<string, Tensor>();
    for (const [k, t] of readSafetensors(join(src, 'model.safetensors'))) old.set(k.replace(/^transformer\./, ''), t);
    old.set('h.0.attn.bias', zeros([1, 1, 32, 32]));
    old.set('h.0.attn.masked_bias', zeros([]));
    writeSafetensors(join(dir, 'model.safetensors'), old);
    const a = await loadModel(dir);
    const b = await loadModel(src);
    const ids = tensor([1, 2, 3], [1, 3], 'int32');
    assert.deepEqual(a.forward(ids).data, b.forward(ids).data);
  });

  test('a missing key, a wrong shape and a missing directory are named', async () => {
    const src = fixtureDir('llama-tiny');
    const dir = mkdtempSync(join(tmpdir(), 'tl-bad-'));
    writeFileSync(join(dir, 'config.json'), readFileSync(join(src, 'config.json')));
    const weights = readSafetensors(join(src, 'model.safetensors'));
    weights.delete('model.norm.weight');
    writeSafetensors(join(dir, 'model.safetensors'), weights);
    await assert.rejects(loadModel(dir), { name: 'StateDictError', message: /model\.norm\.weight/ });
    weights.set('model.norm.weight', zeros([31]));
    writeSafetensors(join(dir, 'model.safetensors'), weights);
    await assert.rejects(loadModel(dir), { name: 'StateDictError', message: /model\.norm\.weight/ });
    await assert.rejects(loadModel(join(dir, 'nope')), { name: 'FileNotFoundError' });
  });
});
