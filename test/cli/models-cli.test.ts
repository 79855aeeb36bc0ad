import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

function cli(...args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8', timeout: 300_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr, json: () => JSON.parse(r.stdout) };
}

describe('init-model, generate and train on one machine', () => {
  const root = mkdtempSync(join(tmpdir(), 'tl-cli-'));
  const model = join(root, 'model');

  test('init-model writes a Hugging Face directory', () => {
    for (const arch of ['gpt2', 'llama']) {
      const dir = join(root, `init-${arch}`);
      const r = cli('init-model', '--arch', arch, '--layers', '1', '--hidden', '32', '--heads', '4', '--out', dir, '--seed', '3', '--json');
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.json().arch, arch);
      assert.deepEqual(readdirSync(dir).sort(), ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json']);
    }
    const again = cli('init-model', '--out', join(root, 'init-gpt2'));
    assert.equal(again.code, 2, 'refuses a non-empty directory');
  });

  test('generate is reproducible for a seed and streams text', () => {
    assert.equal(cli('init-model', '--arch', 'llama', '--layers', '1', '--hidden', '32', '--heads', '4', '--kv-heads', '2', '--out', model).code, 0);
    const args = ['generate', '--model', model, '--prompt', '7+8=', '--max-new-tokens', '6', '--temperature', '0.8', '--seed', '4', '--local', '0'];
    const a = cli(...args, '--json').json();
    const b = cli(...args, '--json').json();
    assert.deepEqual(a.tokens, b.tokens);
    assert.equal(a.tokens.length, 6);
    const human = cli(...args);
    assert.equal(human.code, 0, human.stderr);
    assert.ok(human.stdout.length > 0);
  });

  test('generate --local 3 (a local swarm) gives the tokens of --local 0; --strategy reaches the plan', () => {
    // every strategy's plan computing one process's logits bit for bit: test/p2p/stages.test.ts; here the CLI's way there
    const base = ['generate', '--model', model, '--prompt', '12+', '--max-new-tokens', '5', '--backend', 'js', '--json'];
    const local = cli(...base, '--local', '0').json();
    const r = cli(...base, '--local', '3', '--strategy', 'ring-memory-weighted');
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.json().tokens, local.tokens);
    const bad = cli(...base, '--local', '3', '--strategy', 'greedy');
    assert.equal(bad.code, 2, 'an unknown strategy is refused before any swarm starts');
  });

  test('train saves checkpoints and --resume continues exactly where it stopped', () => {
    const common = ['train', '--model', model, '--task', 'addition', '--batch', '8', '--lr', '0.003', '--backend', 'js', '--json'];
    const straight = cli(...common, '--steps', '6', '--eval-every', '3', '--eval-size', '4').json();
    const out = join(root, 'ckpt');
    const first = cli(...common, '--steps', '6', '--eval-every', '3', '--eval-size', '4', '--out', out);
    assert.equal(first.code, 0, first.stderr);
    assert.deepEqual(first.json().losses, straight.losses);
    const out2 = join(root, 'ckpt2');
    const part = cli(...common, '--steps', '6', '--eval-every', '2', '--eval-size', '4', '--out', out2, '--stop-at', '3');
    assert.equal(part.code, 0, part.stderr);
    assert.deepEqual(part.json().losses, straight.losses.slice(0, 3));
    const resumed = cli(...common, '--steps', '6', '--eval-every', '2', '--eval-size', '4', '--out', out2, '--resume');
    assert.equal(resumed.code, 0, resumed.stderr);
    assert.deepEqual(resumed.json().losses, straight.losses);
  });

  test('train --local 3 (a swarm of separate processes) gives the losses and accuracy of --local 0; --schedule reaches the trainer', () => {
    const gpt = join(root, 'gpt3');
    assert.equal(cli('init-model', '--arch', 'gpt2', '--layers', '3', '--hidden', '32', '--heads', '4', '--max-positions', '32', '--out', gpt).code, 0);
    const base = ['train', '--model', gpt, '--task', 'addition', '--steps', '10', '--batch', '8', '--micro-batches', '4', '--lr', '0.003',
      '--eval-every', '10', '--eval-size', '20', '--backend', 'js', '--json'];
    const local = cli(...base, '--local', '0').json();
    // both schedules giving one process's losses bit for bit: test/p2p/training.test.ts; 1f1b across the CLI's swarm below
    for (const schedule of ['gpipe']) {
      const r = cli(...base, '--local', '3', '--schedule', schedule);
      assert.equal(r.code, 0, r.stderr);
      const result = r.json();
      assert.deepEqual(result.losses, local.losses, schedule);
      assert.equal(result.accuracy, local.accuracy, schedule);
      assert.equal(result.stages.length, 5, 'the user\'s two ends and three workers');
      assert.match(r.stderr, /layer 1[\s\S]*layer 2[\s\S]*layer 3/);
    }
    // two stages, each on two workers that reduce their gradients among themselves
    const replicated = cli(...base, '--local', '4', '--replicas', '2', '--schedule', '1f1b');
    assert.equal(replicated.code, 0, replicated.stderr);
    replicated.json().losses.forEach((l: number, i: number) => assert.ok(Math.abs(l - local.losses[i]) <= 1e-5 * local.losses[i], `step ${i + 1}`));
    assert.match(replicated.stderr, /replica 1/);
    // a checkpoint of a distributed run resumes (weights, AdamW state, data order) across workers or in one process,
    // and so does a one-process checkpoint across workers: the losses of the straight run, bit for bit
    // (a distributed checkpoint resumed across workers is the two directions at once: a checkpoint has one format)
    const resumable = ['train', '--model', gpt, '--task', 'addition', '--steps', '10', '--batch', '8', '--micro-batches', '4', '--lr', '0.003',
      '--eval-every', '5', '--eval-size', '8', '--backend', 'js', '--json'];
    const straight = cli(...resumable, '--local', '0').json().losses;
    for (const [first, second] of [['3', '0'], ['0', '3']]) {
      const dir = join(root, `resume-${first}-${second}`);
      const part = cli(...resumable, '--out', dir, '--stop-at', '5', '--local', first);
      assert.equal(part.code, 0, part.stderr);
      const rest = cli(...resumable, '--out', dir, '--resume', '--local', second);
      assert.equal(rest.code, 0, rest.stderr);
      assert.deepEqual(rest.json().losses, straight, `--local ${first} then --local ${second}`);
    }
  });

  test('train on a text file reports the held-out loss', () => {
    const text = join(root, 'corpus.txt');
    writeFileSync(text, 'the quick brown fox jumps over the lazy dog. '.repeat(40));
    const r = cli('train', '--model', model, '--data', text, '--steps', '3', '--batch', '2', '--seq-len', '16', '--json', '--local', '0');
    assert.equal(r.code, 0, r.stderr);
    const result = r.json();
    assert.equal(result.losses.length, 3);
    assert.ok(result.loss > 0 && Number.isFinite(result.loss));
  });

  test('user errors are one line', () => {
    for (const args of [
      ['train', '--model', model, '--steps', '2'],
      ['train', '--model', join(root, 'missing'), '--task', 'addition', '--steps', '2'],
      ['train', '--model', model, '--task', 'algebra', '--steps', '2'],
      ['generate', '--model', model, '--prompt', 'x', '--bootstrap', '/ip4/127.0.0.1/tcp/1/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA'],
      ['train', '--model', model, '--task', 'addition', '--steps', '2', '--replicas', '2'],
      ['train', '--model', model, '--task', 'addition', '--steps', '2', '--local', '2', '--replicas', '2'],
      ['init-model', '--arch', 'rnn', '--out', join(root, 'x')],
    ]) {
      const r = cli(...args);
      assert.ok(r.code === 1 || r.code === 2, args.join(' '));
      assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
    }
  });
});
