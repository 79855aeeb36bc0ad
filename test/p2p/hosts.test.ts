import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { launchNode, type NodeProcess, nodeCommand } from '../../src/swarm/index.ts';
import { hostPair } from '../helpers/netns.ts';

const run = promisify(execFile);

/** Runs `tensorlink ARGS` to its end, on a host (a command prefix such as `ip netns exec NS`) or here. */
async function tensorlink(args: string[], on: string[] = []): Promise<{ stdout: string; stderr: string }> {
  const command = [...on, process.execPath, ...nodeCommand(), ...args];
  return run(command[0], command.slice(1), { timeout: 120_000, maxBuffer: 16 * 1024 * 1024 });
}

describe('across two hosts (Linux network namespaces joined by a veth pair)', () => {
  const pair = hostPair();
  const nodes: NodeProcess[] = [];
  after(() => {
    for (const n of nodes) n.process.kill('SIGKILL');
    pair.remove();
  });

  test('a user on host B generates across workers on hosts A and B that listen on 0.0.0.0: the tokens of one process', async () => {
    const [a, b] = pair.hosts;
    const dir = join(mkdtempSync(join(tmpdir(), 'tl-hosts-')), 'model');
    await tensorlink(['init-model', '--arch', 'gpt2', '--layers', '4', '--hidden', '32', '--heads', '4', '--max-positions', '64', '--out', dir, '--seed', '5']);
    const prompt = ['--model', dir, '--prompt', '12+34=', '--max-new-tokens', '12', '--backend', 'js', '--json'];
    const local = JSON.parse((await tensorlink(['generate', ...prompt])).stdout) as { tokens: number[] };

    const anywhere = ['--listen', '/ip4/0.0.0.0/tcp/0', '--backend', 'js'];
    const validator = await launchNode(['validator', ...anywhere], 60_000, { prefix: a.exec });
    nodes.push(validator);
    const boot = validator.addrs.find((x) => x.includes(`/ip4/${a.ip}/`));
    assert.ok(boot, `the validator announces its routable address: ${validator.addrs.join(' ')}`);
    const workers = await Promise.all([a, b].map((h) => launchNode(['worker', '--bootstrap', boot, ...anywhere], 60_000, { prefix: h.exec })));
    nodes.push(...workers);
    // the trap: a worker on 0.0.0.0 announces 127.0.0.1 first, which is the dialer's own host anywhere else
    for (const [i, w] of workers.entries()) {
      assert.match(w.addrs[0], /^\/ip4\/127\.0\.0\.1\//);
      assert.ok(w.addrs.some((x) => x.includes(`/ip4/${[a, b][i].ip}/`)), w.addrs.join(' '));
    }

    // the user on host B: the validator and worker A are across the link, worker B is local to it
    const remote = await tensorlink(['generate', ...prompt, '--bootstrap', boot, '--listen', '/ip4/0.0.0.0/tcp/0', '--strategy', 'parameter-balanced'], b.exec);
    const result = JSON.parse(remote.stdout) as { tokens: number[] };
    assert.deepEqual(result.tokens, local.tokens);
    // the plan used both hosts' workers (so the chain crossed the link worker to worker, and back to the user)
    for (const w of workers) assert.ok(remote.stderr.includes(`…${w.peerId.slice(-6)}`), `worker ${w.peerId} took a section:\n${remote.stderr}`);
  });
});
