// Issue #31's sharing and failover acceptance, every node its own process: four workers each host a block of two
// models (one copy of each whatever the sessions), three user processes generate from both at once holding only the
// ends, each with one process's tokens; and a host SIGKILLed in the middle of a session: the session goes on over
// other hosts with the same tokens.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { multiaddr } from '@multiformats/multiaddr';
import { generate, loadModel } from '../../src/models/index.ts';
import { createNode, parseStatsAnswer, request } from '../../src/p2p/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { listModels } from '../../src/user/index.ts';
import { rss, type Running, startNode, waitFor } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

function cli(...args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args, '--backend', 'js'], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, `tensorlink ${args.join(' ')} failed:\n${r.stderr}`);
  return JSON.parse(r.stdout) as { tokens: number[]; text: string; models?: { name: string; complete: boolean }[] };
}

/** `tensorlink ARGS` as its own process, resolving to its JSON result. */
function cliAsync(...args: string[]): Promise<{ tokens: number[]; text: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args, '--backend', 'js'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.once('exit', (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(`tensorlink ${args.join(' ')} exited ${code}: ${err}`))));
  });
}

describe('hosted models shared by users in their own processes', () => {
  setBackend('js');
  const dir = mkdtempSync(join(tmpdir(), 'tl-host-share-'));
  const nodes: Running[] = [];
  const stops: (() => Promise<void> | void)[] = [];
  after(async () => {
    for (const stop of stops) await Promise.resolve(stop()).catch(() => {});
    for (const n of nodes) if (n.child.exitCode === null) n.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('4 hosts, 2 models, 3 users at once; then a host SIGKILLed mid-session', { timeout: 240_000 }, async () => {
    const models = ['alpha', 'beta'].map((name, i) => {
      const out = join(dir, name);
      cli('init-model', '--arch', 'llama', '--layers', '4', '--hidden', '128', '--heads', '4', '--kv-heads', '2', '--max-positions', '512',
        '--out', out, '--seed', String(11 + i), '--json');
      return { name, dir: out };
    });
    const validator = await startNode(['validator', '--listen', '/ip4/127.0.0.1/tcp/0', '--backend', 'js']);
    nodes.push(validator);
    const boot = validator.addrs[0];
    const hosts: Running[] = [];
    for (let b = 0; b < 4; b++) {
      hosts.push(await startNode(['worker', '--bootstrap', boot, '--backend', 'js', ...models.flatMap((m) => ['--host', `${m.name}=${m.dir}:${b}-${b}`])]));
    }
    nodes.push(...hosts);
    // the index and the reference tokens are read in this process (each CLI process costs a second of CPU to start)
    const user = await createNode();
    stops.push(() => user.stop());
    const index = async () => (await listModels(user, multiaddr(boot))).models;
    await waitFor('both models complete', async () => {
      const models = await index();
      return models.length === 2 && models.every((m) => m.complete);
    }, 15_000);
    /** One process's greedy tokens for a prompt, as `generate --model DIR` gives them. */
    const local = async (dir: string, prompt: string, maxNewTokens: number) => {
      const model = await loadModel(dir);
      const { tokens } = await generate(model, model.tokenizer!.encode(prompt), { maxNewTokens, temperature: 0 });
      return { tokens, text: model.tokenizer!.decode(tokens) };
    };
    const before = hosts.map((h) => rss(h.child.pid!));

    // three users at once, from both models; each holds only the ends, each gets one process's tokens
    const prompt = (p: string) => ['--prompt', p, '--max-new-tokens', '24', '--json'];
    const asks = [[models[0], 'The swarm'], [models[1], 'Hello'], [models[0], 'Once upon']] as const;
    const results = await Promise.all(asks.map(([m, p]) => cliAsync('generate', '--model', m.name, '--bootstrap', boot, '--ends', m.dir, ...prompt(p))));
    for (const [i, [m, p]] of asks.entries()) {
      assert.deepEqual(results[i].tokens, (await local(m.dir, p, 24)).tokens, `user ${i} (${m.name})`);
    }
    // each host holds one copy of each span it hosts, whatever the sessions: two hosted jobs, their weights once
    {
      for (const h of hosts) {
        const raw = await request(user, multiaddr(h.addrs[0]), { type: 'stats' });
        const stats = parseStatsAnswer(raw);
        const jobs = (raw.memory as { jobs: { jobId: string }[] }).jobs;
        const hosted = jobs.filter((j) => j.jobId.startsWith('host_'));
        assert.equal(hosted.length, 2, 'one hosted job per model');
        assert.equal(stats.sessions, 0, 'the sessions were closed');
      }
    }
    const grown = hosts.map((h, i) => rss(h.child.pid!) - before[i]);
    process.stderr.write(`3 users over 4 host processes and 2 models: tokens equal one process's; host RSS growth ${grown.map((g) => `${(g / 2 ** 20).toFixed(1)}`).join(', ')} MiB\n`);

    // failover: a fifth host serves alpha's block 2 too, so block 2 has two hosts; whichever of the two the session's
    // route took (routes follow measured round trips: on a loaded machine either may win) is SIGKILLed once the session
    // is open on it, and the session goes on over the other with the same text
    const spare = await startNode(['worker', '--bootstrap', boot, '--backend', 'js', '--host', `alpha=${models[0].dir}:2-2`]);
    nodes.push(spare);
    await waitFor('the spare in the index', async () => (await index()).find((m) => m.name === 'alpha')!.hosts.length === 5, 15_000);
    const long = ['--prompt', 'A long story', '--max-new-tokens', '200'];
    const want = await local(models[0].dir, 'A long story', 200);
    const sessionsOn = async (h: Running) => parseStatsAnswer(await request(user, multiaddr(h.addrs[0]), { type: 'stats' })).sessions;
    const child = spawn(process.execPath, [BIN, 'generate', '--model', 'alpha', '--bootstrap', boot, '--ends', models[0].dir, ...long, '--backend', 'js'],
      { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let killing: Promise<Running | null> | null = null;
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => {
      err += d;
      // the route is known: the session opens on its hosts with the first step; the host of block 2 that has it dies
      killing ??= /blocks on/.test(err)
        ? (async () => {
            // until the generation ends: however slow the machine, the session is on one of them while it runs
            while (child.exitCode === null) {
              for (const h of [spare, hosts[2]]) {
                if ((await sessionsOn(h)) === 0) continue;
                h.child.kill('SIGKILL');
                return h;
              }
              await new Promise((r) => setTimeout(r, 50));
            }
            return null;
          })()
        : null;
    });
    const code = await new Promise<number | null>((r) => child.once('exit', r));
    assert.equal(code, 0, err);
    const killed = await (killing as Promise<Running | null> | null);
    assert.ok(killed, 'a host of block 2 had the session');
    assert.equal(killed.child.signalCode, 'SIGKILL');
    assert.match(err, /blocks 2-2 lost their host …\w+: moved to others, \d+ steps replayed/, 'the session lost its host mid-way and went on');
    assert.equal(out.replace(/\n$/, ''), want.text, 'the same text as without the failure');
    process.stderr.write(`a host SIGKILLed mid-session (${killed === spare ? 'the spare' : 'the first host of block 2'}): ${err.match(/blocks 2-2 lost[^\n]*/)![0]}; the text equals one process's\n`);
  });
});
