import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const exec = promisify(execFile);

/** Runs `examples/SCRIPT ARGS` as its README says (through tsx); resolves to its output once it exits 0. */
async function run(script: string, ...args: string[]): Promise<string> {
  const r = await exec(process.execPath, ['--import', 'tsx', `examples/${script}`, ...args], { cwd: ROOT, encoding: 'utf8', timeout: 240_000 })
    .catch((err: { code?: number; stderr?: string }) => assert.fail(`${script} exited ${err.code}: ${err.stderr}`));
  return r.stdout;
}

// One training step each (their [steps] argument): each script runs to its end and logs its last step's loss; what the
// losses are is tested in test/models/trainer.test.ts and test/user/training-across-workers.test.ts. The three run at
// once (each its own process, the two distributed ones each with a swarm of its own on free ports): most of their time
// is their processes starting and their swarms waiting on sockets.
describe('examples/ run as written', { concurrency: true }, () => {
  test('local-model.ts: trains, saves, loads and answers', async () => {
    assert.match(await run('local-model.ts', '1'), /step 1 {2}loss \d[\s\S]*saved to .*exact match on 200 held-out sums: [\d.]+%; 47\+38=/);
  });

  test('distributed-generation.ts: the swarm gives the tokens of one process', async () => {
    assert.match(await run('distributed-generation.ts'), /same tokens/);
  });

  test('distributed-training.ts: trains across three workers and saves the weights', async () => {
    assert.match(await run('distributed-training.ts', '1'), /step 1 {2}loss \d[\s\S]*trained weights saved to /);
  });
});
