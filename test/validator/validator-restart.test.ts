import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { multiaddr } from '@multiformats/multiaddr';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer, LocalTrainer } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { distribute, listPeers } from '../../src/user/index.ts';
import { type Running, startNode, waitFor } from '../helpers/processes.ts';

/** A TCP port free on 127.0.0.1 now (the restarted validator must listen where the workers look for it). */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

describe('a validator killed and restarted with its --data', () => {
  setBackend('js');
  const children: Running[] = [];
  after(() => {
    for (const c of children) c.child.kill('SIGKILL');
  });

  test('the job goes on while it is down (users and workers talk directly), and it comes back with its identity and its registry rebuilt', async () => {
    const STEPS = 9;
    const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
    const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 2, heads: 4, maxPositions: 32 });
    const batches = () => {
      const task = additionTask({ seed: 3 });
      const rng = new Generator(4);
      return Array.from({ length: STEPS }, () => taskBatch(task, tok, rng, 8, 256));
    };
    const local = new LocalTrainer(createModel(config, { seed: 6 }), { lr: 3e-3, totalSteps: STEPS, microBatches: 2 });
    const expected = batches().map((b) => local.step(b).loss);

    const data = mkdtempSync(join(tmpdir(), 'tl-validator-'));
    const listen = `/ip4/127.0.0.1/tcp/${await freePort()}`;
    const launch = async () => {
      const v = await startNode(['validator', '--backend', 'js', '--data', data, '--listen', listen]);
      children.push(v);
      return v;
    };
    let validator = await launch();
    const boot = validator.addrs[0];
    for (let i = 0; i < 2; i++) children.push(await startNode(['worker', '--bootstrap', boot, '--backend', 'js']));
    const user = await createNode();
    try {
      const workers = async () => (await listPeers(user, multiaddr(boot))).filter((p) => p.roles.includes('worker')).length;
      await waitFor('two workers', async () => (await workers()) === 2, 20_000);
      const model = createModel(config, { seed: 6 });
      // every record sampled: the checks need the validator, and must not stop the job while it is gone
      const dm = await distribute(user, boot, model, { strategy: 'parameter-balanced', training: true, verify: { sampleRate: 1 } });
      const trainer = await dm.trainer({ optimizer: { lr: 3e-3 }, totalSteps: STEPS, microBatches: 2 });
      const all = batches();
      const losses: number[] = [];
      for (const b of all.slice(0, 3)) losses.push((await trainer.step(b)).loss);
      const checkedBefore = dm.verification!.checked;
      assert.ok(checkedBefore > 0, 'the validator re-ran records while it was up');

      validator.child.kill('SIGKILL');
      await new Promise((r) => validator.child.once('exit', r));
      for (const b of all.slice(3, 6)) losses.push((await trainer.step(b)).loss);

      const before = validator.peerId;
      validator = await launch();
      assert.equal(validator.peerId, before, 'it comes back with its identity (its --data)');
      await waitFor('the registry rebuilt from announcements', async () => (await workers()) === 2, 20_000);
      for (const b of all.slice(6)) losses.push((await trainer.step(b)).loss);

      assert.deepEqual(losses, expected);
      assert.equal(dm.failovers.length, 0, 'no worker was lost');
      const summary = (await dm.settle())!;
      assert.ok(summary.unchecked > 0, 'records sampled while it was down were left unchecked');
      assert.ok(summary.checked > checkedBefore, 'checks resumed once it was back');
      assert.equal(summary.failed, 0);
      await dm.close();
    } finally {
      await user.stop();
    }
  });
});
