import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { swarmChildren, swarmGone } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

describe('tensorlink demo, interrupted', () => {
  test('Ctrl-C during training stops every process of the swarm', async () => {
    const child = spawn(process.execPath, [BIN, 'demo'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    await new Promise<void>((resolve) => {
      child.stderr.on('data', (d) => {
        stderr += d;
        if (stderr.includes('[3/5]')) resolve();
      });
    });
    assert.ok(swarmChildren(child.pid!).length >= 4, 'the validator and the workers run');
    child.kill('SIGINT');
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    assert.notEqual(code, 0);
    assert.deepEqual(await swarmGone(child.pid!), []);
    assert.equal(spawnSync('ps', ['-o', 'pid=', '-p', String(child.pid)], { encoding: 'utf8' }).stdout.trim(), '', 'the demo itself ended');
  });
});
