import assert from 'node:assert/strict';
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

function cli(...args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8', timeout: 300_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr, json: () => JSON.parse(r.stdout) };
}

/**
 * `tensorlink ROLE ARGS` as its own process (js, one thread; it stops when this process is gone): resolves to it and
 * its addresses once it says it is ready.
 */
function node(role: 'validator' | 'worker', args: string[]): Promise<{ process: ChildProcess; addrs: string[] }> {
  const child = spawn(process.execPath, [BIN, role, ...args, '--backend', 'js', '--threads', '1', '--parent-pid', String(process.pid)],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.stdout.on('data', (d) => {
      out += d;
      const ready = out.split('\n').find((l) => l.includes('"event":"ready"'));
      if (ready) resolve({ process: child, addrs: JSON.parse(ready).addrs });
    });
    child.once('exit', (code) => reject(new Error(`${role} exited (${code}): ${err}`)));
  });
}

/**
 * A validator and `workers` workers on 127.0.0.1, each its own process: what `--local N` starts, here started once
 * for several runs that join it with --bootstrap (from the built CLI, as the swarm of --local N: the library's
 * localSwarm would load the TypeScript sources into this process, seconds of CPU).
 */
async function swarmOf(workers: number, dir: string) {
  const started: ChildProcess[] = [];
  const stop = () => Promise.all(started.map((p) => new Promise((resolve) => {
    if (p.exitCode !== null || p.signalCode !== null) return resolve(null);
    const force = setTimeout(() => p.kill('SIGKILL'), 5_000);
    p.once('exit', () => resolve(clearTimeout(force)));
    p.kill('SIGTERM');
  })));
  try {
    const validator = await node('validator', ['--data', join(dir, 'validator')]);
    started.push(validator.process);
    const bootstrap = validator.addrs[0];
    const all = await Promise.allSettled(Array.from({ length: workers }, (_, i) => node('worker', ['--bootstrap', bootstrap, '--data', join(dir, `worker-${i}`)])));
    for (const w of all) if (w.status === 'fulfilled') started.push(w.value.process);
    for (const w of all) if (w.status === 'rejected') throw w.reason;
    return { bootstrap, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

describe('init-model, generate and train on one machine', () => {
  const root = mkdtempSync(join(tmpdir(), 'tl-cli-'));
  const model = join(root, 'model');

  test('init-model writes a Hugging Face directory', () => {
    for (const arch of ['gpt2', 'llama']) {
      const dir = join(root, `init-${arch}`);
      const r = cli('init-model', '--arch', arch, '--layers', '1', '--hidden', '32', '--heads', '4', '--out', dir, '--seed', '3', '--json');
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.json().arch, arch);
      assert.deepEqual(readdirSync(dir).sort(), ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json']);
    }
    const again = cli('init-model', '--out', join(root, 'init-gpt2'));
    assert.equal(again.code, 2, 'refuses a non-empty directory');
  });

  test('generate is reproducible for a seed and streams text', () => {
    assert.equal(cli('init-model', '--arch', 'llama', '--layers', '1', '--hidden', '32', '--heads', '4', '--kv-heads', '2', '--out', model).code, 0);
    const args = ['generate', '--model', model, '--prompt', '7+8=', '--max-new-tokens', '6', '--temperature', '0.8', '--seed', '4', '--local', '0'];
    const a = cli(...args, '--json').json();
    const b = cli(...args, '--json').json();
    assert.deepEqual(a.tokens, b.tokens);
    assert.equal(a.tokens.length, 6);
    const human = cli(...args);
    assert.equal(human.code, 0, human.stderr);
    assert.ok(human.stdout.length > 0);
  });

  test('generate --local 2 (a local swarm) gives the tokens of --local 0; --strategy reaches the plan', () => {
    // every strategy's plan computing one process's logits bit for bit: test/user/stages.test.ts; here the CLI's way there
    const base = ['generate', '--model', model, '--prompt', '12+', '--max-new-tokens', '5', '--backend', 'js', '--json'];
    const local = cli(...base, '--local', '0').json();
    const r = cli(...base, '--local', '2', '--strategy', 'ring-memory-weighted');
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.json().tokens, local.tokens);
    const bad = cli(...base, '--local', '3', '--strategy', 'greedy');
    assert.equal(bad.code, 2, 'an unknown strategy is refused before any swarm starts');
  });

  test('generate --local 2 --speculative lookup, and --draft DIR: the tokens of --local 0, in fewer passes', () => {
    const base = ['generate', '--model', model, '--prompt', '12+34=46. 12+34=46. 12+', '--max-new-tokens', '24', '--backend', 'js', '--json'];
    const plain = cli(...base, '--local', '0').json();
    const r = cli(...base, '--local', '2', '--speculative', 'lookup');
    assert.equal(r.code, 0, r.stderr);
    const spec = r.json();
    assert.deepEqual(spec.tokens, plain.tokens);
    assert.equal(plain.passes, plain.tokens.length);
    assert.ok(spec.passes < spec.tokens.length, `${spec.passes} passes for ${spec.tokens.length} tokens`);
    assert.ok(spec.speculative.accepted > 0 && spec.speculative.accepted <= spec.speculative.drafted, JSON.stringify(spec.speculative));
    assert.equal(spec.verification.failed, 0);
    // a draft model (here the model itself: every draft accepted), in this process
    const drafted = cli(...base, '--local', '0', '--draft', model).json();
    assert.deepEqual(drafted.tokens, plain.tokens);
    assert.equal(drafted.speculative.accepted, drafted.speculative.drafted);
    assert.ok(drafted.passes < drafted.tokens.length);
  });

  describe('train across workers', () => {
    // the replicas run starts its own swarm (--local 4); the resumed run joins one started here (--bootstrap), which
    // runs only while it does
    const gpt = join(root, 'gpt3');
    let swarm: Awaited<ReturnType<typeof swarmOf>> | null = null;
    const stopSwarm = async () => {
      await swarm?.stop();
      swarm = null;
    };
    const base = () => ['train', '--model', gpt, '--task', 'addition', '--steps', '10', '--batch', '8', '--micro-batches', '4', '--lr', '0.003',
      '--eval-every', '4', '--eval-size', '8', '--backend', 'js', '--json'];
    let straight: { losses: number[]; evals: { step: number }[] };
    before(async () => {
      assert.equal(cli('init-model', '--arch', 'gpt2', '--layers', '3', '--hidden', '32', '--heads', '4', '--max-positions', '32', '--out', gpt).code, 0);
      straight = cli(...base(), '--local', '0').json();
      swarm = await swarmOf(3, join(root, 'swarm'));
    });
    after(stopSwarm);

    test('--replicas: two stages, each on two workers that reduce their gradients among themselves', () => {
      // (a checkpoint of replicas holds their average: written here, not read back)
      // --local 4: the CLI starts a swarm of its own (the path a user takes first), and stops it
      const r = cli(...base(), '--local', '4', '--replicas', '2', '--schedule', '1f1b', '--out', join(root, 'replicated'), '--stop-at', '3');
      assert.equal(r.code, 0, r.stderr);
      const losses: number[] = r.json().losses;
      assert.equal(losses.length, 3);
      losses.forEach((l, i) => assert.ok(Math.abs(l - straight.losses[i]) <= 1e-5 * straight.losses[i], `step ${i + 1}`));
      assert.match(r.stderr, /replica 1/);
    });

    test('a checkpoint resumes exactly where it stopped, in one process or across workers; --schedule reaches the trainer', async () => {
      // one run in four parts, each resuming the checkpoint the part before wrote with --out: the losses and the
      // evaluations of the straight run, bit for bit. One process's checkpoint resumes across workers, the workers' in
      // one process, and one process's in one process (the workers' across workers is the first two at once: a
      // checkpoint has one format). Both schedules giving one process's losses bit for bit: test/user/training-across-workers.test.ts;
      // gpipe across the CLI's swarm here, 1f1b with replicas above
      const dir = join(root, 'resumed');
      const parts: [number, string[]][] = [
        [3, ['--local', '0']],
        [6, ['--bootstrap', swarm!.bootstrap, '--schedule', 'gpipe', '--resume']],
        [8, ['--local', '0', '--resume']],
        [10, ['--local', '0', '--resume']],
      ];
      let from = 0;
      for (const [stop, where] of parts) {
        const r = cli(...base(), '--out', dir, '--stop-at', String(stop), ...where);
        assert.equal(r.code, 0, r.stderr);
        const result = r.json();
        assert.deepEqual(result.losses, straight.losses.slice(0, stop), where.join(' '));
        // the workers' evaluation (at step 4) scores what one process scores
        assert.deepEqual(result.evals, straight.evals.filter((e) => e.step > from && e.step <= stop), `evaluations, ${where.join(' ')}`);
        if (where[0] === '--bootstrap') {
          assert.equal(result.stages.length, 5, 'the user\'s two ends and three workers');
          assert.match(r.stderr, /layer 1[\s\S]*layer 2[\s\S]*layer 3/);
          await stopSwarm();
        }
        from = stop;
      }
    });
  });

  test('train on a text file reports the held-out loss', () => {
    const text = join(root, 'corpus.txt');
    writeFileSync(text, 'the quick brown fox jumps over the lazy dog. '.repeat(40));
    const r = cli('train', '--model', model, '--data', text, '--steps', '3', '--batch', '2', '--seq-len', '16', '--json', '--local', '0');
    assert.equal(r.code, 0, r.stderr);
    const result = r.json();
    assert.equal(result.losses.length, 3);
    assert.ok(result.loss > 0 && Number.isFinite(result.loss));
  });

  test('user errors are one line', () => {
    for (const args of [
      ['train', '--model', model, '--steps', '2'],
      ['train', '--model', join(root, 'missing'), '--task', 'addition', '--steps', '2'],
      ['train', '--model', model, '--task', 'algebra', '--steps', '2'],
      ['generate', '--model', model, '--prompt', 'x', '--bootstrap', '/ip4/127.0.0.1/tcp/1/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA'],
      ['train', '--model', model, '--task', 'addition', '--steps', '2', '--replicas', '2'],
      ['train', '--model', model, '--task', 'addition', '--steps', '2', '--local', '2', '--replicas', '2'],
      ['init-model', '--arch', 'rnn', '--out', join(root, 'x')],
    ]) {
      const r = cli(...args);
      assert.ok(r.code === 1 || r.code === 2, args.join(' '));
      assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
    }
  });
});
