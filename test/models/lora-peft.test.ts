// Issue #32: LoRA adapters equal to PEFT. The fixtures (test/fixtures/peft, made by PEFT 0.21 over the transformers
// fixtures) hold PEFT's adapter files and what PEFT computed through them with the base frozen: logits, the loss
// with labels = input_ids, and every adapter parameter's gradient.
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { readSafetensors } from '../../src/io/index.ts';
import {
  adaptModel, adapterState, ADAPTER_CONFIG, loadAdapter, loadModel, mergeAdapter, parseLoraSpec, readAdapterConfig, saveAdapter,
} from '../../src/models/index.ts';
import { crossEntropy, setBackend, tensor, type Tensor } from '../../src/tensor/index.ts';
import { relErr } from '../helpers/weights.ts';

const PEFT = fileURLToPath(new URL('../fixtures/peft/', import.meta.url));
const HF = fileURLToPath(new URL('../fixtures/hf/', import.meta.url));

function shiftedTargets(ids: Tensor): Tensor {
  const [b, t] = ids.shape;
  return tensor(Array.from({ length: b * t }, (_, i) => (i % t === t - 1 ? -100 : ids.data[i + 1])), [b, t], 'int32');
}

describe('LoRA adapters equal PEFT', () => {
  const tmp = mkdtempSync(join(tmpdir(), 'tl-lora-'));
  after(() => rmSync(tmp, { recursive: true, force: true }));

  for (const [fixture, base] of [['llama3-lora', 'llama3'], ['qwen2-lora', 'qwen2']]) {
    test(`${fixture}: logits, loss and every adapter gradient as PEFT's, no gradient on the base; saved and loaded again`, async () => {
      setBackend('js');
      const dir = join(PEFT, fixture);
      const meta = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as { loss: number; adapter_keys: string[]; r: number; alpha: number };
      const ref = readSafetensors(join(dir, 'reference.safetensors'));
      const grads = readSafetensors(join(dir, 'grads.safetensors'));
      const model = await loadModel(join(HF, base), { adapter: dir });
      // the adapter's parameters under PEFT's file keys, and only they train
      const state = adapterState(model);
      assert.deepEqual([...state.keys()].sort(), [...meta.adapter_keys].sort());
      const trainable = model.trainableParameters();
      assert.equal(trainable.length, meta.adapter_keys.length);
      assert.ok(trainable.every((p) => [...state.values()].includes(p)));
      // namedParameters() lists them under the same keys, the base under its own names
      const named = new Map(model.namedParameters());
      for (const [key, p] of state) assert.equal(named.get(key), p, key);
      assert.equal([...named.keys()].filter((k) => k.startsWith('base_model.model.')).length, state.size);

      const ids = ref.get('input_ids')!;
      const logits = model.forward(ids);
      const logitsErr = relErr(logits.data, ref.get('logits')!.data);
      const loss = crossEntropy(logits, shiftedTargets(ids));
      const lossErr = Math.abs(loss.item() - meta.loss) / Math.abs(meta.loss);
      loss.backward();
      let gradErr = 0;
      for (const [key, p] of state) {
        const want = grads.get(key.replace(/\.weight$/, '.default.weight'));
        assert.ok(want, `PEFT has a gradient for ${key}`);
        assert.ok(p.grad, `${key} has a gradient`);
        gradErr = Math.max(gradErr, relErr(p.grad.data, want.data));
      }
      const baseGrads = model.parameters().filter((p) => !trainable.includes(p) && p.grad !== null);
      process.stderr.write(`${fixture}: logits ${logitsErr.toExponential(2)}  loss ${lossErr.toExponential(2)}  grads ${gradErr.toExponential(2)} (${state.size} tensors)\n`);
      assert.ok(logitsErr < 1e-4, `logits ${logitsErr}`);
      assert.ok(lossErr < 1e-4, `loss ${loss.item()} vs PEFT's ${meta.loss}`);
      assert.ok(gradErr < 1e-3, `gradients ${gradErr}`);
      assert.equal(baseGrads.length, 0, 'no gradient on any base parameter');

      // saved as PEFT saves it: the same keys and config fields; loaded again, the same logits bit for bit
      const out = join(tmp, fixture);
      saveAdapter(model, readAdapterConfig(dir), out, join(HF, base));
      assert.deepEqual([...readSafetensors(join(out, 'adapter_model.safetensors')).keys()].sort(), [...meta.adapter_keys].sort());
      const theirs = JSON.parse(readFileSync(join(dir, ADAPTER_CONFIG), 'utf8')) as Record<string, unknown>;
      const ours = JSON.parse(readFileSync(join(out, ADAPTER_CONFIG), 'utf8')) as Record<string, unknown>;
      for (const key of Object.keys(ours)) assert.ok(key in theirs, `PEFT's config has the field ${key}`);
      for (const key of ['peft_type', 'r', 'lora_alpha', 'bias', 'task_type', 'use_dora', 'use_rslora', 'fan_in_fan_out']) assert.deepEqual(ours[key], theirs[key], key);
      assert.deepEqual([...(ours.target_modules as string[])].sort(), [...(theirs.target_modules as string[])].sort());
      const again = await loadModel(join(HF, base), { adapter: out });
      assert.deepEqual(again.forward(ids).data, logits.data);

      // merged into the base: a plain model that computes what the adapted one did
      const merged = await loadModel(join(HF, base), { adapter: dir });
      assert.equal(mergeAdapter(merged), meta.adapter_keys.length / 2);
      assert.equal(adapterState(merged).size, 0);
      assert.ok(relErr(merged.forward(ids).data, logits.data) < 1e-5);
    });
  }

  test('new factors: B zero (the model computes what its base does), A drawn from the seed and the layer\'s path alone', async () => {
    setBackend('js');
    const [plain, a, b] = await Promise.all([0, 1, 2].map(() => loadModel(join(HF, 'llama3'))));
    const ids = readSafetensors(join(PEFT, 'llama3-lora', 'reference.safetensors')).get('input_ids')!;
    adaptModel(a, { r: 4, alpha: 8, targets: ['q_proj', 'v_proj'] }, { seed: 7 });
    // b adapts fewer layers: the ones both adapt draw the same factors (what a section of the model needs)
    adaptModel(b, { r: 4, alpha: 8, targets: 'model\\.layers\\.1\\.self_attn\\.v_proj' }, { seed: 7 });
    assert.deepEqual(a.forward(ids).data, plain.forward(ids).data);
    const [sa, sb] = [adapterState(a), adapterState(b)];
    assert.deepEqual([...sb.keys()], ['base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight', 'base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight']);
    for (const [key, t] of sb) assert.deepEqual(t.data, sa.get(key)!.data, key);
    assert.ok(sa.get('base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight')!.data.some((v) => v !== 0));
  });

  test('--adapter specs, and adapters that do not fit are clear errors', async () => {
    assert.deepEqual(parseLoraSpec('lora'), { r: 8, alpha: 16, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] });
    assert.deepEqual(parseLoraSpec('lora:r=4,alpha=8,targets=q_proj,v_proj'), { r: 4, alpha: 8, targets: ['q_proj', 'v_proj'] });
    assert.throws(() => parseLoraSpec('dora'), /the adapter kind is lora/);
    assert.throws(() => parseLoraSpec('lora:r=0'), /whole number ≥ 1/);
    assert.throws(() => parseLoraSpec('lora:rank=4'), /unknown key 'rank'/);
    // an adapter whose targets name no layer of the model; one whose file lacks keys its config implies
    await assert.rejects(loadModel(join(HF, 'gpt2'), { adapter: join(PEFT, 'llama3-lora') }), { name: 'InvalidArgumentError', message: /name no linear layer/ });
    const short = join(tmp, 'short');
    mkdirSync(short);
    copyFileSync(join(PEFT, 'qwen2-lora', 'adapter_model.safetensors'), join(short, 'adapter_model.safetensors'));
    const config = JSON.parse(readFileSync(join(PEFT, 'qwen2-lora', ADAPTER_CONFIG), 'utf8')) as Record<string, unknown>;
    writeFileSync(join(short, ADAPTER_CONFIG), JSON.stringify({ ...config, target_modules: ['q_proj', 'k_proj', 'v_proj'] }));
    await assert.rejects(loadModel(join(HF, 'qwen2'), { adapter: short }), { name: 'StateDictError', message: /missing \[base_model\.model\.model\.layers\.0\.self_attn\.k_proj/ });
    writeFileSync(join(short, ADAPTER_CONFIG), JSON.stringify({ ...config, use_dora: true }));
    await assert.rejects(loadModel(join(HF, 'qwen2'), { adapter: short }), { name: 'InvalidArgumentError', message: /DoRA/ });
    await assert.rejects(loadModel(join(HF, 'llama3'), { adapter: join(HF, 'qwen2') }), { name: 'FileNotFoundError', message: /not a PEFT adapter folder/ });
    const model = await loadModel(join(HF, 'llama3'));
    assert.throws(() => loadAdapter(model, join(PEFT, 'llama3-lora')) && loadAdapter(model, join(PEFT, 'llama3-lora')), /already has LoRA factors/);
  });
});
