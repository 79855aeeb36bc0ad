import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

function run(script: string, ...args: string[]) {
  const r = spawnSync(process.execPath, ['--import', 'tsx', `examples/${script}`, ...args], { cwd: ROOT, encoding: 'utf8', timeout: 240_000 });
  assert.equal(r.status, 0, `${script}: ${r.stderr}`);
  return r.stdout;
}

// One training step each (their [steps] argument): each script runs to its end and logs its last step's loss; what the
// losses are is tested in test/models/trainer.test.ts and test/user/training-across-workers.test.ts.
describe('examples/ run as written', () => {
  test('local-model.ts: trains, saves, loads and answers', () => {
    assert.match(run('local-model.ts', '1'), /step 1 {2}loss \d[\s\S]*saved to .*exact match on 200 held-out sums: [\d.]+%; 47\+38=/);
  });

  test('distributed-generation.ts: the swarm gives the tokens of one process', () => {
    assert.match(run('distributed-generation.ts'), /same tokens/);
  });

  test('distributed-training.ts: trains across three workers and saves the weights', () => {
    assert.match(run('distributed-training.ts', '1'), /step 1 {2}loss \d[\s\S]*trained weights saved to /);
  });
});
