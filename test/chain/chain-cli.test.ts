import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { clients, readDeployment, startAnvil } from '../../src/chain/index.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

describe('tensorlink chain', () => {
  test('starts anvil on a free port, deploys the contracts, prints the ready line, writes the file; Ctrl-C stops anvil', async () => {
    const file = join(mkdtempSync(join(tmpdir(), 'tl-chain-')), 'contracts.json');
    const child = spawn(process.execPath, [BIN, 'chain', '--out', file], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    const ready = await new Promise<Record<string, unknown>>((resolve, reject) => {
      child.stdout.on('data', (d) => {
        out += d;
        const line = out.split('\n').find((l) => l.includes('"event":"ready"'));
        if (line) resolve(JSON.parse(line));
      });
      child.once('exit', (code) => reject(new Error(`exited ${code}`)));
    });
    assert.match(String(ready.rpc), /^http:\/\/127\.0\.0\.1:\d+$/);
    const d = readDeployment(file);
    assert.deepEqual(d.contracts, ready.contracts);
    const c = clients(d.rpc, d.chainId);
    for (const address of Object.values(d.contracts)) assert.ok(((await c.publicClient.getCode({ address })) ?? '0x').length > 2, address);
    child.kill('SIGINT');
    await new Promise((resolve) => child.once('exit', resolve));
    const port = new URL(String(ready.rpc)).port;
    const left = spawnSync('ps', ['-eo', 'pid,stat,args'], { encoding: 'utf8' }).stdout.split('\n').filter((l) => l.includes(`--port`) && l.includes('anvil') && !/ Z/.test(l));
    assert.deepEqual(left.filter((l) => l.includes(port)), []);
  });

  test('--rpc joins a running node: deploys once, then finds the same contracts; an unreachable node is a clear error', async () => {
    const chain = await startAnvil();
    try {
      const file = join(mkdtempSync(join(tmpdir(), 'tl-chain-')), 'contracts.json');
      const run = () => spawnSync(process.execPath, [BIN, 'chain', '--rpc', chain.rpc, '--out', file], { encoding: 'utf8' });
      const first = run();
      assert.equal(first.status, 0, first.stderr);
      assert.match(first.stderr, /deployed the contracts/);
      const second = run();
      assert.equal(second.status, 0, second.stderr);
      assert.match(second.stderr, /found the contracts/);
      assert.deepEqual(JSON.parse(second.stdout).contracts, JSON.parse(first.stdout).contracts);
      const bad = spawnSync(process.execPath, [BIN, 'chain', '--rpc', 'http://127.0.0.1:1'], { encoding: 'utf8' });
      assert.equal(bad.status, 1);
      assert.match(bad.stderr, /cannot reach the Ethereum JSON-RPC endpoint http:\/\/127\.0\.0\.1:1/);
      assert.doesNotMatch(bad.stderr, /\n\s+at /, 'no stack trace');
    } finally {
      await chain.stop();
    }
  });
});
