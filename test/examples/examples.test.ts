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

describe('examples/ run as written', () => {
  test('local-model.ts: trains, saves, loads and answers', () => {
    const out = run('local-model.ts', '100');
    assert.match(out, /step 100 {2}loss \d/);
    assert.match(out, /saved to .*exact match on 200 held-out sums: [\d.]+%; 47\+38=/);
  });

  test('distributed-generation.ts: the swarm gives the tokens of one process', () => {
    assert.match(run('distributed-generation.ts'), /same tokens/);
  });

  test('distributed-training.ts: trains across three workers and saves the weights', () => {
    const out = run('distributed-training.ts', '10');
    assert.match(out, /step 10 {2}loss \d/);
    assert.match(out, /trained weights saved to /);
  });
});
