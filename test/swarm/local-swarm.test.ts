import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { multiaddr } from '@multiformats/multiaddr';
import { localSwarm } from '../../src/swarm/index.ts';
import { createNode, type PeerRecord, request } from '../../src/p2p/index.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** The processes `pid` started (and, with `deep`, theirs and so on). */
function descendants(pid: number, deep = true): number[] {
  let listed = '';
  try {
    listed = execFileSync('ps', ['-o', 'pid=', '--ppid', String(pid)], { encoding: 'utf8' });
  } catch {
    // ps exits 1 when the process has no children
  }
  const children = listed.split('\n').map((s) => Number(s.trim())).filter((n) => n > 0);
  return deep ? children.flatMap((c) => [c, ...descendants(c)]) : children;
}

describe('local swarm', () => {
  // a swarm whose test failed half way is not left running (it would hold the test runner open)
  const spawned: ReturnType<typeof spawn>[] = [];
  after(() => {
    for (const c of spawned) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  });

  test('localSwarm starts a validator and workers as processes and close() stops them all', async () => {
    const swarm = await localSwarm({ workers: 2, memory: '512MiB' });
    const client = await createNode();
    try {
      const reply = await request(client, multiaddr(swarm.bootstrap), { type: 'status' });
      const workers = (reply.peers as PeerRecord[]).filter((p) => p.roles.includes('worker'));
      assert.deepEqual(workers.map((w) => w.peerId).sort(), swarm.workers.map((w) => w.peerId).sort());
    } finally {
      await client.stop();
      await swarm.close();
    }
    for (const p of [swarm.validator, ...swarm.workers]) assert.ok(p.process.exitCode !== null || p.process.signalCode !== null);
  });

  test('tensorlink swarm leaves no process behind after Ctrl-C', async () => {
    const child = spawn(process.execPath, [BIN, 'swarm', '--workers', '1'], { stdio: ['ignore', 'pipe', 'pipe'] });
    spawned.push(child);
    const ready = await new Promise<{ bootstrap: string }>((resolve, reject) => {
      let out = '';
      child.stdout.on('data', (d) => {
        out += d;
        const line = out.split('\n').find((l) => l.includes('"event":"ready"'));
        if (line) resolve(JSON.parse(line));
      });
      child.once('exit', (code) => reject(new Error(`swarm exited ${code}`)));
    });
    assert.match(ready.bootstrap, /^\/ip4\/127\.0\.0\.1\/tcp\/\d+\/p2p\//);
    // a validator, a worker and the chain: anvil, under a shell that ends it when the swarm is gone
    assert.equal(descendants(child.pid!, false).length, 3, 'a validator, a worker and the chain');
    const children = descendants(child.pid!);
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    child.kill('SIGINT');
    assert.equal(await exited, 0);
    for (let i = 0; i < 40 && children.some(running); i++) await new Promise((r) => setTimeout(r, 100));
    assert.ok(!children.some(running), 'every swarm process has exited');
  });

  test('the nodes of a swarm killed with SIGKILL exit on their own', async () => {
    const child = spawn(process.execPath, [BIN, 'swarm', '--workers', '1'], { stdio: ['ignore', 'pipe', 'pipe'] });
    spawned.push(child);
    await new Promise<void>((resolve, reject) => {
      let out = '';
      child.stdout.on('data', (d) => {
        out += d;
        if (out.includes('"event":"ready"')) resolve();
      });
      child.once('exit', (code) => reject(new Error(`swarm exited ${code}`)));
    });
    assert.equal(descendants(child.pid!, false).length, 3);
    const children = descendants(child.pid!);
    child.kill('SIGKILL');
    for (let i = 0; i < 100 && children.some(running); i++) await new Promise((r) => setTimeout(r, 100));
    assert.ok(!children.some(running), 'orphaned nodes (and the chain) noticed their parent was gone');
  });
});
