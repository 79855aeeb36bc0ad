// Issue #33: workers at home, each behind its own NAT router (nftables masquerade, unsolicited traffic dropped), join a
// validator on a public address with nothing opened on their routers: each takes a slot on the validator's relay and
// announces its /p2p-circuit address, and a user on the internet trains and generates across both, equal to one
// process (bit for bit, js), one of the routers a symmetric NAT; after the relay restarts they take their slots again.
// The "internet" is a switch in 11.x/24, a public range routed nowhere.
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { Libp2p } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { reach } from '../../src/cli/commands/nodes.ts';
import { launchNode } from '../../src/cli/local-swarm.ts';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, generate, HFTokenizer, llamaConfig, LocalTrainer } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { distribute, listWorkers } from '../../src/user/index.ts';
import { type Home, natHome } from '../helpers/nat.ts';
import { hostMesh } from '../helpers/netns.ts';
import { waitFor } from '../helpers/processes.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);

describe('workers behind NAT routers', () => {
  setBackend('js');
  const mesh = hostMesh(3, { subnet: `11.${(process.pid % 200) + 20}.9`, publicRange: true });
  const homes: Home[] = [];
  const children: ChildProcess[] = [];
  let user: Libp2p;
  let boot: string;
  let workers: string[];
  // the validator keeps its identity (a data directory) and its port across a restart: workers' relayed addresses name both
  const validatorData = mkdtempSync(join(tmpdir(), 'tl-nat-validator-'));
  const port = 20_000 + (process.pid % 20_000);
  let validatorProcess: ChildProcess | null = null;
  const startValidator = async () => {
    const v = await launchNode(['validator', '--listen', `/ip4/0.0.0.0/tcp/${port}`, '--data', validatorData, '--backend', 'js'], 60_000, { prefix: mesh.hosts[0].exec });
    children.push(v.process);
    validatorProcess = v.process;
    return v;
  };
  before(async () => {
    // the second router is a symmetric NAT (a random source port for every flow: hole punching would fail there)
    homes.push(natHome(mesh.hosts[1]), natHome(mesh.hosts[2], { fullyRandom: true }));
    const anywhere = ['--listen', '/ip4/0.0.0.0/tcp/0', '--backend', 'js'];
    const validator = await startValidator();
    boot = validator.addrs.find((a) => a.startsWith(`/ip4/${mesh.hosts[0].ip}/`))!;
    const started = await Promise.all(homes.map((h) => launchNode(['worker', '--bootstrap', boot, ...anywhere], 60_000, { prefix: h.host.exec })));
    for (const w of started) children.push(w.process);
    workers = started.map((w) => w.peerId);
    user = await createNode({ listen: [`/ip4/${mesh.rootIp}/tcp/0`] });
  });
  after(async () => {
    await user?.stop();
    for (const c of children) c.kill('SIGKILL');
    for (const h of homes) h.remove();
    mesh.remove();
    rmSync(validatorData, { recursive: true, force: true });
  });

  test('each worker is reached through the validator\'s relay; a job across both trains and generates as one process', async () => {
    // the registry lists each worker at its relayed address (its own are private: 192.168.x behind its router)
    const { value: listed } = await waitFor('both workers listed with a relayed address', async () => {
      const ws = (await listWorkers(user, multiaddr(boot))).filter((w) => workers.includes(w.peerId));
      return ws.length === 2 && ws.every((w) => w.addrs.some((a) => a.includes('/p2p-circuit'))) ? ws : null;
    }, 40_000);
    const wan = `/ip4/${mesh.rootIp.split('.').slice(0, 3).join('.')}.`;
    for (const w of listed) {
      assert.equal(reach(w.addrs), 'relayed', '`status` shows it relayed');
      assert.ok(!w.addrs.some((a) => a.startsWith(wan) && !a.includes('/p2p-circuit')), `no public address of its own: ${w.addrs.join(', ')}`);
    }

    const config = llamaConfig({ vocabSize: 257, hidden: 32, layers: 2, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 64 });
    const STEPS = 3;
    const reference = createModel(config, { seed: 5 });
    const local = new LocalTrainer(reference, { lr: 3e-3, totalSteps: STEPS, microBatches: 2 });
    const batches = () => {
      const task = additionTask({ seed: 2 });
      const rng = new Generator(7);
      return Array.from({ length: STEPS }, () => taskBatch(task, tok, rng, 4, 256));
    };
    const expected = batches().map((b) => local.step(b).loss);
    const prompt = [5, 17, 2, 9];
    const { tokens } = await generate(reference, prompt, { maxNewTokens: 8, temperature: 0 });

    const dm = await distribute(user, boot, createModel(config, { seed: 5 }), { strategy: 'parameter-balanced', training: true, verify: { sampleRate: 0 } });
    try {
      assert.deepEqual(new Set(dm.assignment.map((a) => a.peerId)), new Set(workers), 'both NATed workers hold a section');
      const trainer = await dm.trainer({ optimizer: { lr: 3e-3 }, totalSteps: STEPS, microBatches: 2, schedule: '1f1b' });
      const losses: number[] = [];
      for (const b of batches()) losses.push((await trainer.step(b)).loss);
      assert.deepEqual(losses, expected);
      assert.deepEqual((await dm.generate(prompt, { maxNewTokens: 8, temperature: 0 })).tokens, tokens);
    } finally {
      await dm.close();
    }
  });

  test('the relay restarts: each worker takes its slot again within 30 s and the job runs across both again', async () => {
    validatorProcess!.kill('SIGKILL');
    const stopped = Date.now();
    await startValidator();
    const { value: back } = await waitFor('both workers relayed again', async () => {
      const ws = (await listWorkers(user, multiaddr(boot))).filter((w) => workers.includes(w.peerId));
      return ws.length === 2 && ws.every((w) => w.addrs.some((a) => a.includes('/p2p-circuit'))) ? ws : null;
    }, 45_000);
    const seconds = (Date.now() - stopped) / 1000;
    process.stderr.write(`relay restarted: both workers reachable through it again after ${seconds.toFixed(1)} s\n`);
    assert.equal(back.length, 2);
    assert.ok(seconds < 30, `${seconds} s`);
    const config = llamaConfig({ vocabSize: 257, hidden: 32, layers: 2, heads: 4, kvHeads: 2, intermediate: 48, maxPositions: 64 });
    const reference = createModel(config, { seed: 6 });
    const prompt = [7, 1, 8];
    const { tokens } = await generate(reference, prompt, { maxNewTokens: 6, temperature: 0 });
    const dm = await distribute(user, boot, createModel(config, { seed: 6 }), { strategy: 'parameter-balanced', verify: { sampleRate: 0 } });
    try {
      assert.deepEqual(new Set(dm.assignment.map((a) => a.peerId)), new Set(workers));
      assert.deepEqual((await dm.generate(prompt, { maxNewTokens: 6, temperature: 0 })).tokens, tokens);
    } finally {
      await dm.close();
    }
  });
});
