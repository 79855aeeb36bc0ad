// Issue #31 (first part) through the CLI, each node its own process: two `worker --host` processes host a model made by
// init-model (one its first blocks, one the rest, at int4), `models --json` lists it complete, and `generate --model NAME
// --bootstrap --ends DIR` gives the tokens `generate --model DIR --quantize int4` gives in one process.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { type Running, startNode, startServe, waitFor } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

function cli(...args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args, '--backend', 'js'], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, `tensorlink ${args.join(' ')} failed:\n${r.stderr}`);
  return JSON.parse(r.stdout) as Record<string, unknown>;
}

describe('hosting through the CLI', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-host-cli-'));
  const nodes: Running[] = [];
  after(() => {
    for (const n of nodes) n.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('worker --host, models --json, generate --model NAME --bootstrap', async () => {
    const model = join(dir, 'tiny');
    cli('init-model', '--arch', 'llama', '--layers', '4', '--hidden', '64', '--heads', '4', '--kv-heads', '2', '--out', model, '--seed', '5', '--json');
    const empty = await startNode(['validator', '--listen', '/ip4/127.0.0.1/tcp/0', '--backend', 'js']);
    nodes.push(empty);
    // no hosts: an empty index, exit 0
    assert.deepEqual(cli('models', '--bootstrap', empty.addrs[0], '--json'), { models: [] });
    const boot = empty.addrs[0];
    for (const blocks of ['0-1', '2-3']) {
      nodes.push(await startNode(['worker', '--bootstrap', boot, '--host', `tiny=${model}:${blocks}`, '--quantize', 'int4', '--backend', 'js']));
    }
    type Host = { layers: number[]; format: string; state: string };
    type Index = { models: { name: string; layers: number; complete: boolean; hosts: Host[] }[] };
    const { value: index } = await waitFor('both hosts in the index', async () => {
      const answer = cli('models', '--bootstrap', boot, '--json') as Index;
      return answer.models.length === 1 && answer.models[0].complete ? answer : null;
    }, 10_000);
    const [entry] = index.models;
    assert.equal(entry.name, 'tiny');
    assert.equal(entry.layers, 4);
    assert.deepEqual(entry.hosts.map((h) => [h.layers, h.format, h.state]).sort(), [[[0, 1], 'int4', 'online'], [[2, 3], 'int4', 'online']]);
    const prompt = ['--prompt', 'Hello, hosts', '--max-new-tokens', '12'];
    // the user's ends at int4 too: the same model one process holds at int4
    const hosted = cli('generate', '--model', 'tiny', '--bootstrap', boot, '--ends', model, '--quantize', 'int4', ...prompt, '--json');
    const local = cli('generate', '--model', model, '--quantize', 'int4', ...prompt, '--json');
    assert.equal((hosted.tokens as number[]).length, 12);
    assert.deepEqual(hosted.tokens, local.tokens);
    assert.equal(hosted.text, local.text);
    process.stderr.write(`hosted tiny at int4 over 2 host processes: the same ${(hosted.tokens as number[]).length} tokens as one process at int4\n`);

    // serve on the hosted model: one process holds the ends for all its clients; 8 streamed chats at once, each a session
    // of its own on the hosts (decoded speculatively), each with the text its prompt gets alone
    const server = await startServe(['--model', 'tiny', '--bootstrap', boot, '--ends', model, '--quantize', 'int4', '--speculative', 'lookup']);
    nodes.push({ child: server.child, peerId: '', addrs: [] });
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none' });
    const prompts = ['The quick brown fox', 'Hello, world', 'Once upon a time', 'In the beginning', 'To be or not', 'A B C', 'zzz', 'Lorem'];
    const messages = (p: string) => [{ role: 'user' as const, content: p }];
    const alone: string[] = [];
    for (const p of prompts.slice(0, 2)) {
      alone.push((await client.chat.completions.create({ model: 'tiny', messages: messages(p), max_tokens: 8, temperature: 0 })).choices[0].message.content ?? '');
    }
    const together = await Promise.all(prompts.map(async (p) => {
      const stream = await client.chat.completions.create({ model: 'tiny', messages: messages(p), max_tokens: 8, temperature: 0, stream: true });
      let text = '';
      let finish: string | null = null;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? '';
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
      return { text, finish };
    }));
    assert.ok(together.every((t) => t.finish !== null), 'every stream ends');
    assert.deepEqual(together.slice(0, 2).map((t) => t.text), alone, 'a chat streamed beside 7 others has the text it gets alone');
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const counter = (name: string) => Number(new RegExp(`^tensorlink_serve_speculative_${name}_total\\{model="tiny"\\} (\\d+)$`, 'm').exec(metrics)?.[1]);
    assert.equal(counter('tokens'), 10 * 8, 'every row decoded speculatively');
    process.stderr.write(`serve --model tiny --speculative lookup: ${counter('tokens')} tokens in ${counter('passes')} passes\n`);
    process.stderr.write(`serve --model tiny (hosted): 8 streamed chats at once, each ended, the first two as alone\n`);
  });
});
