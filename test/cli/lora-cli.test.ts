// Issue #32 through the CLI: a model `train` pre-trained on fortunes gets a LoRA adapter trained over its int4 base
// (QLoRA) that lowers its held-out loss; the adapter is PEFT's layout; `generate --adapter` (here and across workers),
// `merge` and `serve --adapter` agree.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { readSafetensors } from '../../src/io/index.ts';
import { adaptModel, adapterState, loadModel, saveAdapter } from '../../src/models/index.ts';
import { Generator, randn } from '../../src/tensor/index.ts';
import { startServe } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
/** Every command on js (bit for bit), but where '--backend' is among the arguments already. */
const run = (...args: string[]) =>
  spawnSync(process.execPath, [BIN, ...args, ...(args.includes('--backend') ? [] : ['--backend', 'js'])], { encoding: 'utf8', timeout: 240_000 });
function cli(...args: string[]): Record<string, unknown> {
  const r = run(...args, '--json');
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Record<string, unknown>;
}

describe('LoRA through the CLI', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-lora-cli-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('train --adapter lora --quantize int4 over a pre-trained model lowers its held-out loss; generate --adapter equals the merged model and across workers; serve --adapter', async () => {
    const [base, pre, adapter, merged] = ['base', 'pre', 'adapter', 'merged'].map((n) => join(dir, n));
    cli('init-model', '--arch', 'llama', '--layers', '2', '--hidden', '64', '--heads', '4', '--kv-heads', '2', '--max-positions', '64', '--out', base, '--seed', '4');
    const data = ['--data', 'fortunes', '--batch', '8', '--seq-len', '32', '--eval-size', '64', '--seed', '1'];
    const before = cli('train', '--model', base, ...data, '--lr', '3e-3', '--steps', '24', '--eval-every', '24', '--out', pre) as { loss: number };
    // the int4 products run on onnxruntime (MatMulNBits): js's exact kernels are the slow reference
    const lora = ['--adapter', 'lora:r=4,alpha=8', '--quantize', 'int4', '--lr', '1e-2', '--backend', 'ort'];
    const tuned = cli('train', '--model', pre, ...data, ...lora, '--steps', '16', '--eval-every', '16', '--out', adapter) as { loss: number };
    process.stderr.write(`fortunes held-out loss: pre-trained ${before.loss.toFixed(4)}, with a LoRA adapter over its int4 base ${tuned.loss.toFixed(4)}\n`);
    assert.ok(tuned.loss < before.loss, `the adapter lowers the held-out loss (${before.loss} → ${tuned.loss})`);
    // the checkpoint is the adapter in PEFT's layout, not the model
    assert.ok(existsSync(join(adapter, 'adapter_config.json')));
    assert.ok(!existsSync(join(adapter, 'model.safetensors')));
    const keys = [...readSafetensors(join(adapter, 'adapter_model.safetensors')).keys()];
    assert.equal(keys.length, 2 * 2 * 7, 'A and B of seven projections in each of two blocks');
    assert.ok(keys.every((k) => /^base_model\.model\.model\.layers\.[01]\.(self_attn|mlp)\.\w+_proj\.lora_[AB]\.weight$/.test(k)), keys[0]);

    // through the adapter (float32 base) and the adapter merged into the base: the same greedy tokens
    const prompt = ['--prompt', 'A fortune:', '--max-new-tokens', '12'];
    const adapted = cli('generate', '--model', pre, '--adapter', adapter, ...prompt).tokens;
    cli('merge', '--model', pre, '--adapter', adapter, '--out', merged);
    assert.deepEqual(cli('generate', '--model', merged, ...prompt).tokens, adapted);
    // across two worker processes, each holding its section's factors beside the base
    assert.deepEqual(cli('generate', '--model', pre, '--adapter', adapter, ...prompt, '--local', '2').tokens, adapted);

    // serve: one base, two adapters, picked by the request's model ('pre:tuned'); requests for each at once
    const other = join(dir, 'other');
    const model = await loadModel(pre);
    const config = { r: 2, alpha: 4, targets: ['q_proj', 'v_proj'] };
    adaptModel(model, config, { seed: 9 });
    const rng = new Generator(3);
    for (const [key, t] of adapterState(model)) if (key.includes('lora_B')) t.data.set(randn(t.shape, { generator: rng }).data);
    saveAdapter(model, config, other, pre);
    const texts = [cli('generate', '--model', pre, ...prompt).text, cli('generate', '--model', pre, '--adapter', adapter, ...prompt).text,
      cli('generate', '--model', pre, '--adapter', other, ...prompt).text] as string[];
    assert.notEqual(texts[2], texts[0], 'the other adapter changes the text');
    const { child, url } = await startServe(['--model', pre, '--adapter', `tuned=${adapter}`, '--adapter', `other=${other}`]);
    try {
      const models = await (await fetch(`${url}/v1/models`)).json() as { data: { id: string }[] };
      assert.deepEqual(models.data.map((m) => m.id), ['pre', 'pre:tuned', 'pre:other']);
      const ask = async (id: string) => {
        const r = await fetch(`${url}/v1/completions`, {
          method: 'POST', headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: id, prompt: 'A fortune:', max_tokens: 12, temperature: 0 }),
        });
        return await r.json() as { model: string; choices: { text: string }[] };
      };
      const answers = await Promise.all(['pre', 'pre:tuned', 'pre:other', 'pre:tuned'].map(ask));
      assert.deepEqual(answers.map((a) => a.model), ['pre', 'pre:tuned', 'pre:other', 'pre:tuned']);
      assert.deepEqual(answers.map((a) => a.choices[0].text), [...texts, texts[1]]);
      assert.equal((await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'pre:nope', prompt: 'x' }) })).status, 404);
    } finally {
      child.kill('SIGKILL');
    }

    // compact weights alone have nothing to train
    assert.match(run('train', '--model', pre, ...data, '--steps', '1', '--quantize', 'int4').stderr, /nothing to train in them; train an adapter over them \(--adapter lora\)/);
  });
});
