// Issue #32 through the CLI across worker processes: `train --adapter` over `--local 3` (three worker processes, 1F1B),
// stopped and resumed from its adapter checkpoint, gives this process's losses, held-out loss and adapter, bit for bit.
import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { readSafetensors } from '../../src/io/index.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
function cli(...args: string[]): Record<string, unknown> {
  const r = spawnSync(process.execPath, [BIN, ...args, '--backend', 'js', '--json'], { encoding: 'utf8', timeout: 240_000 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Record<string, unknown>;
}
const exec = promisify(execFile);
/** cli(), not waited for: resolves to its JSON once it exits 0. */
async function started(...args: string[]): Promise<Record<string, unknown>> {
  const r = await exec(process.execPath, [BIN, ...args, '--backend', 'js', '--json'], { encoding: 'utf8', timeout: 240_000 })
    .catch((err: { code?: number; stderr?: string }) => assert.fail(`exited ${err.code}: ${err.stderr}`));
  return JSON.parse(r.stdout) as Record<string, unknown>;
}

describe('LoRA across worker processes through the CLI', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-lora-workers-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('train --adapter across 3 worker processes (1F1B) equals this process, bit for bit, and resumes from its checkpoint', async () => {
    const base = join(dir, 'base3');
    cli('init-model', '--arch', 'llama', '--layers', '3', '--hidden', '32', '--heads', '4', '--kv-heads', '2', '--max-positions', '64', '--out', base, '--seed', '4');
    const job = [
      '--model', base, '--data', 'fortunes', '--batch', '8', '--seq-len', '24', '--eval-size', '16', '--seed', '1', '--lr', '1e-2',
      '--adapter', 'lora:r=4,alpha=8,targets=q_proj,v_proj,down_proj', '--micro-batches', '2', '--steps', '4', '--eval-every', '4',
    ];
    const across = ['--local', '3', '--schedule', '1f1b', '--strategy', 'parameter-balanced'];
    type Run = { losses: number[]; loss: number; stages: unknown[] };
    // across workers: stopped after 2 steps (its checkpoint the adapter and AdamW's state of the factors), then resumed on
    // a new swarm to the end; the one process's run goes on meanwhile (most of the first part is its swarm starting)
    const three = join(dir, 'three');
    const [one, half] = await Promise.all([
      started('train', ...job, '--out', join(dir, 'one')) as Promise<Run>,
      started('train', ...job, ...across, '--stop-at', '2', '--out', three) as Promise<Run>,
    ]);
    const resumed = cli('train', ...job, ...across, '--out', three, '--resume') as Run;
    process.stderr.write(`LoRA losses, one process ${one.losses.join(', ')}; 3 worker processes ${resumed.losses.join(', ')}\n`);
    assert.equal(resumed.stages.length, 5, 'the user\'s two ends and three workers');
    assert.deepEqual(half.losses, one.losses.slice(0, 2));
    assert.deepEqual(resumed.losses, one.losses);
    assert.equal(resumed.loss, one.loss, 'the held-out loss');
    const [a, b] = [join(dir, 'one'), three].map((d) => readSafetensors(join(d, 'adapter_model.safetensors')));
    assert.deepEqual([...b.keys()].sort(), [...a.keys()].sort());
    for (const [k, t] of a) assert.deepEqual(b.get(k)!.data, t.data, k);
  });
});
