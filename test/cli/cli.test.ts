import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

function cli(...args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8', timeout: 240_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** `node NODE-ARGS` as its own process, not waited for: resolves to its exit code and output once it exits. */
function started(nodeArgs: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  // two demos at once while other test files share the two cores: minutes, not seconds
  const child = spawn(process.execPath, nodeArgs, { stdio: ['ignore', 'pipe', 'pipe'], timeout: 240_000 });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  return new Promise((resolve) => child.once('close', (code) => resolve({ code, stdout, stderr })));
}

describe('tensorlink CLI', () => {
  test('on the js backend the demo is bitwise reproducible; where onnxruntime cannot load, it runs on js alone', async () => {
    // an honest swarm of one worker (3 steps are too few to be sure of catching the demo's cheater; generation would then stop
    // on it): the whole demo, at its smallest (the demo at its size: test/demo.test.ts; a swarm of several workers giving one
    // process's results bit for bit: test/user/training-across-workers.test.ts). The second run cannot load onnxruntime, so it
    // falls back to js by itself, its workers too: the same loss bit for bit shows both. The three runs are independent
    // (each its own swarm and chain on free ports) and run at once.
    const demo = ['demo', '--json', '--steps', '3', '--workers', '1', '--cheat', 'none'];
    const preload = fileURLToPath(new URL('../helpers/no-ort.cjs', import.meta.url));
    const [js, r, forced] = await Promise.all([
      started([BIN, ...demo, '--backend', 'js']),
      started(['--require', preload, BIN, ...demo]),
      started(['--require', preload, BIN, 'demo', '--backend', 'ort']),
    ]);
    const a = JSON.parse(js.stdout);
    assert.equal(r.code, 0, r.stderr);
    const b = JSON.parse(r.stdout);
    assert.equal(a.backend, 'js');
    assert.equal(b.backend, 'js');
    assert.equal(a.finalLoss, b.finalLoss);
    assert.equal(forced.code, 1);
    assert.match(forced.stderr, /onnxruntime-node could not be loaded/);
  });

  test('user errors print one line, no stack trace, and exit non-zero', () => {
    for (const args of [['demo', '--steps', 'many'], ['demo', '--frobnicate'], ['launch'], ['train']]) {
      const r = cli(...args);
      assert.equal(r.code, 2, args.join(' '));
      assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
      assert.ok(!/\n\s+at /.test(r.stderr), 'no stack trace');
    }
    // local steps average replicas: asked for without them, the user is told what to add
    const sync = cli('train', '--model', 'nowhere', '--task', 'addition', '--steps', '2', '--local', '2', '--sync-every', '4');
    assert.equal(sync.code, 2);
    assert.match(sync.stderr, /--sync-every N averages the replicas of each section: it needs --replicas R with R ≥ 2/);
  });

  test('COMMAND --help prints that command\'s usage only; --version prints the version', () => {
    const serve = cli('serve', '--help');
    assert.equal(serve.code, 0);
    assert.match(serve.stdout, /^usage: tensorlink serve/);
    assert.match(serve.stdout, /--model DIR/);
    assert.ok(!serve.stdout.includes('init-model'), 'no other command');
    const ledger = cli('ledger', '--help');
    assert.match(ledger.stdout, /ledger show/);
    assert.match(ledger.stdout, /ledger verify PROOF-FILE/);
    assert.ok(!ledger.stdout.includes('  train '));
    const v = cli('--version');
    assert.equal(v.code, 0);
    assert.match(v.stdout.trim(), /^\d+\.\d+\.\d+$/);
  });
});
