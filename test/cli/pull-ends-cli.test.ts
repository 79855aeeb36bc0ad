// Issue #31 through the CLI: `pull-ends NAME --bootstrap --out DIR` fetches a hosted model's ends, config and tokenizer
// from a `worker --host` process; `generate --model NAME --bootstrap` without --ends pulls them once into the cache and
// gives the tokens one process gives on the model's own directory.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { type Running, startNode, startServe, waitFor } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

function run(env: NodeJS.ProcessEnv, ...args: string[]) {
  return spawnSync(process.execPath, [BIN, ...args, '--backend', 'js'], { encoding: 'utf8', timeout: 120_000, env });
}

function cli(env: NodeJS.ProcessEnv, ...args: string[]) {
  const r = run(env, ...args);
  assert.equal(r.status, 0, `tensorlink ${args.join(' ')} failed:\n${r.stderr}`);
  return { result: JSON.parse(r.stdout) as Record<string, unknown>, stderr: r.stderr };
}

describe('pull-ends through the CLI', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-pull-ends-cli-'));
  const nodes: Running[] = [];
  after(() => {
    for (const n of nodes) n.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('pull-ends NAME --out DIR; generate --model NAME --bootstrap without --ends pulls into the cache once', async () => {
    const env = { ...process.env, TENSORLINK_CACHE: join(dir, 'cache') };
    const model = join(dir, 'tiny');
    // a vocabulary of 20,000: an embedding of 5 MB, two 4 MiB chunks, each sent in 512 KiB pieces
    cli(env, 'init-model', '--arch', 'llama', '--layers', '2', '--hidden', '64', '--heads', '4', '--kv-heads', '2', '--vocab', '20000',
      '--out', model, '--seed', '7', '--json');
    const validator = await startNode(['validator', '--listen', '/ip4/127.0.0.1/tcp/0', '--backend', 'js']);
    nodes.push(validator);
    const boot = validator.addrs[0];
    nodes.push(await startNode(['worker', '--bootstrap', boot, '--host', `tiny=${model}`, '--backend', 'js']));
    await waitFor('the host in the index', async () => {
      const r = cli(env, 'models', '--bootstrap', boot, '--json').result as { models: { complete: boolean }[] };
      return r.models.length === 1 && r.models[0].complete;
    }, 10_000);

    const out = join(dir, 'ends');
    const { result: pulled } = cli(env, 'pull-ends', 'tiny', '--bootstrap', boot, '--out', out, '--json');
    assert.equal(pulled.dir, out);
    assert.match(pulled.hash as string, /^[0-9a-f]{64}$/);
    assert.ok((pulled.bytes as number) > 5_000_000, `the embedding travelled: ${String(pulled.bytes)} bytes`);
    assert.deepEqual(readdirSync(out).sort(), ['config.json', 'model.safetensors', 'tokenizer.json'].concat(
      existsSync(join(model, 'tokenizer_config.json')) ? ['tokenizer_config.json'] : [],
    ).sort());
    assert.deepEqual(readFileSync(join(out, 'tokenizer.json')), readFileSync(join(model, 'tokenizer.json')));
    // a name nobody hosts: a one-line error, exit 1
    const none = run(env, 'pull-ends', 'other', '--bootstrap', boot, '--out', join(dir, 'none'));
    assert.equal(none.status, 1);
    assert.match(none.stderr, /^tensorlink: no host announces a model named 'other'/);
    assert.equal(run(env, 'pull-ends', '--bootstrap', boot, '--out', join(dir, 'none')).status, 2, 'no NAME: a usage error');

    const prompt = ['--prompt', 'Hello, ends', '--max-new-tokens', '10'];
    const local = cli(env, 'generate', '--model', model, ...prompt, '--json').result;
    // without --ends: pulled once into the cache, then read from there
    const first = cli(env, 'generate', '--model', 'tiny', '--bootstrap', boot, ...prompt, '--json');
    assert.deepEqual(first.result.tokens, local.tokens);
    assert.match(first.stderr, /pulled the ends of 'tiny'/);
    assert.ok(existsSync(join(dir, 'cache', 'ends', pulled.hash as string, 'model.safetensors')));
    const again = cli(env, 'generate', '--model', 'tiny', '--bootstrap', boot, ...prompt, '--json');
    assert.deepEqual(again.result.tokens, local.tokens);
    assert.doesNotMatch(again.stderr, /pulled the ends/);
    // serve --model NAME --bootstrap without --ends: the cached ends, the same completion
    const server = await startServe(['--model', 'tiny', '--bootstrap', boot], { env });
    nodes.push({ child: server.child, peerId: '', addrs: [] });
    const answer = await fetch(`${server.url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', prompt: 'Hello, ends', max_tokens: 10, temperature: 0 }),
    });
    assert.equal(answer.status, 200);
    assert.equal(((await answer.json()) as { choices: { text: string }[] }).choices[0].text, local.text);
    process.stderr.write(`pull-ends tiny: ${String(pulled.bytes)} bytes of ends; generate without --ends pulled once, the tokens of one process; serve without --ends the same text\n`);
  });
});
