// Issue #30: `tensorlink convert` and every loader taking a .gguf file. A transformers fixture (real spread, so the logits
// tell models apart) converted to GGUF and back through the CLI, loaded as GGUF in float32 and at int4 from Q4_0.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { loadModel } from '../../src/models/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { readHFReference } from '../helpers/hf-fixtures.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
const cli = (...args: string[]) => spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8' });

describe('tensorlink convert', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-convert-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  setBackend('js');
  const ref = readHFReference('llama3'); // rope scaling llama3, tied head

  test('a directory to GGUF (f32, q4_0) and back: the same logits bit for bit; Q4_0 loads as int4 equal to our int4 of the directory', async () => {
    const f32 = join(dir, 'model.gguf');
    const q4 = join(dir, 'model-q4_0.gguf');
    const back = join(dir, 'back');
    for (const [out, type] of [[f32, 'f32'], [q4, 'q4_0']]) {
      const r = cli('convert', '--model', ref.dir, '--out', out, '--type', type, '--json');
      assert.equal(r.status, 0, r.stderr);
      assert.equal(JSON.parse(r.stdout).type, type);
    }
    const r = cli('convert', '--model', f32, '--out', back, '--json');
    assert.equal(r.status, 0, r.stderr);
    const want = (await loadModel(ref.dir)).forward(ref.inputIds).data;
    assert.deepEqual((await loadModel(f32)).forward(ref.inputIds).data, want);
    assert.deepEqual((await loadModel(back)).forward(ref.inputIds).data, want);
    const fromGGUF = await loadModel(q4, { quantize: 'int4' });
    const fromDir = await loadModel(ref.dir, { quantize: 'int4' });
    const own = fromDir.hfStateDict();
    for (const [name, t] of fromGGUF.hfStateDict()) {
      if (!t.packed) continue;
      assert.deepEqual(t.packed.data, own.get(name)!.packed!.data, name);
      assert.deepEqual(t.packed.scales, own.get(name)!.packed!.scales, name);
    }
    assert.deepEqual(fromGGUF.forward(ref.inputIds).data, fromDir.forward(ref.inputIds).data);
  });

  test('user errors are one line', () => {
    for (const [args, message] of [
      [['--model', ref.dir, '--out', join(dir, 'x'), '--json'], /from a directory to a .gguf file or from a .gguf file to a directory/],
      [['--model', ref.dir, '--out', join(dir, 'y.gguf'), '--type', 'q5_k'], /--type must be one of f32, f16, q8_0, q4_0/],
      [['--model', join(dir, 'none.gguf'), '--out', join(dir, 'z')], /none\.gguf/],
    ] as const) {
      const r = cli('convert', ...args);
      assert.notEqual(r.status, 0);
      assert.match(r.stderr, message);
      assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack trace');
    }
    // what compact weights do not do yet says so
    for (const [args, message] of [
      [['train', '--model', ref.dir, '--task', 'addition', '--steps', '1', '--quantize', 'int4'], /compact weights are frozen/],
      [['generate', '--model', ref.dir, '--prompt', 'a', '--quantize', 'int3'], /--quantize must be int8 or int4/],
    ] as const) {
      const r = cli(...args);
      assert.equal(r.status, 2, r.stderr);
      assert.match(r.stderr, message);
    }
  });
});

describe('a compact job across worker processes, checked by the validator', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-compact-verified-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('generate --quantize int4 --local 3 --verify-rate 1: the validator re-runs every sampled record of the compact sections, all honest', () => {
    // an intermediate size of 171: rows that end in a padded block
    const model = join(dir, 'model');
    const init = cli('init-model', '--arch', 'llama', '--layers', '3', '--hidden', '64', '--heads', '4', '--kv-heads', '2', '--out', model, '--seed', '3');
    assert.equal(init.status, 0, init.stderr);
    const base = ['generate', '--model', model, '--prompt', '12+', '--max-new-tokens', '4', '--backend', 'js', '--json'];
    const r = cli(...base, '--quantize', 'int4', '--local', '3', '--verify-rate', '1');
    assert.equal(r.status, 0, r.stderr);
    const { tokens, verification } = JSON.parse(r.stdout);
    assert.equal(tokens.length, 4);
    // every decoding step of every worker's section sampled and re-run (bit for bit on js), none unchecked
    assert.ok(verification.checked >= 4, JSON.stringify(verification));
    assert.deepEqual([verification.failed, verification.flagged, verification.unchecked], [0, [], 0]);
    assert.doesNotMatch(r.stderr, /nothing checks them/);
    process.stderr.write(`int4 across 3 workers, --verify-rate 1: ${verification.checked} records re-run by the validator, ${verification.failed} failed\n`);
    // the same tokens as one process holding the model at int4
    assert.deepEqual(JSON.parse(cli(...base, '--quantize', 'int4', '--local', '0').stdout).tokens, tokens);
  });
});
