// Issue #50's acceptance for validators that share one view, every node its own process: three validators (blocks
// co-signed by 2 of 3), six workers (one of them a cheater) and two users, one generating from a hosted model (a CLI
// process), one training (this process). The cheater is caught by the validator its user asked and excluded by the
// others; a validator SIGKILLed mid-generation and mid-training loses nothing.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { peerIdFromPrivateKey } from '@libp2p/peer-id';
import { multiaddr } from '@multiformats/multiaddr';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, generate, gpt2Config, HFTokenizer, loadModel, LocalTrainer } from '../../src/models/index.ts';
import { createNode, loadOrCreateIdentity, type PeerRecord, request } from '../../src/p2p/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { distribute, listModels, listPeers } from '../../src/user/index.ts';
import { type Running, startNode, waitFor } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 4, heads: 4, maxPositions: 32 });
const STEPS = 6;
const LR = 3e-3;
const MICRO = 2;

function batches() {
  const task = additionTask({ seed: 2 });
  const rng = new Generator(7);
  return Array.from({ length: STEPS }, () => taskBatch(task, tok, rng, 8, 256));
}

const workerIds = (peers: PeerRecord[]) => peers.filter((p) => p.roles.includes('worker')).map((p) => p.peerId).sort();
const validatorIds = (peers: PeerRecord[]) => peers.filter((p) => p.roles.includes('validator')).map((p) => p.peerId).sort();

describe('three validators sharing one view', () => {
  setBackend('js');
  const dir = mkdtempSync(join(tmpdir(), 'tl-three-validators-'));
  const nodes: Running[] = [];
  const stops: (() => Promise<void>)[] = [];
  after(async () => {
    for (const stop of stops) await stop().catch(() => {});
    for (const n of nodes) if (n.child.exitCode === null && n.child.signalCode === null) n.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('a cheater caught at one validator is excluded by all; one SIGKILLed mid-generation and mid-training: same tokens and losses as one process, blocks co-signed by the two left', { timeout: 240_000 }, async () => {
    const model = join(dir, 'hosted');
    const made = spawnSync(process.execPath, [BIN, 'init-model', '--arch', 'llama', '--layers', '4', '--hidden', '64', '--heads', '4', '--kv-heads', '2',
      '--max-positions', '256', '--out', model, '--seed', '17', '--json'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(made.status, 0, made.stderr);
    // one process's training on the same batches: what the swarm must equal, bit for bit
    const local = new LocalTrainer(createModel(config, { seed: 5 }), { lr: LR, totalSteps: STEPS, warmupSteps: 2, microBatches: MICRO });
    const expected = batches().map((b) => local.step(b).loss);

    // the set: A trusts B and C by id, B dials A, C dials both; a block needs 2 of the 3 signatures
    const [idB, idC] = await Promise.all(['b', 'c'].map(async (d) => peerIdFromPrivateKey(await loadOrCreateIdentity(join(dir, d))).toString()));
    const validator = async (name: string, args: string[]) => {
      const v = await startNode(['validator', '--data', join(dir, name), '--threshold', '2', '--backend', 'js', ...args]);
      nodes.push(v);
      return v;
    };
    const a = await validator('a', ['--validators', `${idB},${idC}`]);
    const b = await validator('b', ['--peers', a.addrs[0], '--validators', idC]);
    const c = await validator('c', ['--peers', `${a.addrs[0]},${b.addrs[0]}`]);
    const boot = [a, b, c].map((v) => v.addrs[0]).join(',');
    const worker = async (...args: string[]) => {
      const w = await startNode(['worker', '--bootstrap', boot, '--backend', 'js', ...args]);
      nodes.push(w);
      return w;
    };
    // four workers for the training job, the third a cheater that adds noise to everything it computes
    const plain = [await worker(), await worker(), await worker('--fault', 'noise'), await worker()];
    const cheater = plain[2].peerId;
    const user = await createNode();
    stops.push(async () => user.stop());
    const on = (v: Running) => multiaddr(v.addrs[0]);
    for (const v of [a, b, c]) await waitFor('every validator lists the four workers', async () => workerIds(await listPeers(user, on(v))).length === 4, 20_000);

    // the training user asks A first (the first of --bootstrap); two copies of a two-section plan, compared before use
    const dm = await distribute(user, boot, createModel(config, { seed: 5 }), {
      strategy: 'parameter-balanced', training: true, verify: { redundancy: 2, sampleRate: 0 },
    });
    stops.push(async () => dm.close());
    assert.ok(dm.assignment.some((x) => x.peerId === cheater), 'the cheater holds a section');
    const trainer = await dm.trainer({ optimizer: { lr: LR }, totalSteps: STEPS, warmupSteps: 2, microBatches: MICRO });
    const all = batches();
    const losses: number[] = [];
    for (const batch of all.slice(0, 2)) losses.push((await trainer.step(batch)).loss);
    assert.deepEqual(dm.verification!.flagged, [cheater], 'caught in the first step (its copy differed: a dispute at A)');
    // A settled the dispute; B and C exclude the cheater from the flag A signed and pushed
    for (const v of [b, c]) {
      await waitFor('B and C exclude the cheater A flagged', async () => (await listPeers(user, on(v))).find((p) => p.peerId === cheater)?.excluded === true, 10_000);
    }

    // two hosts of a model for the generating user (blocks 0-1 and 2-3), every step re-run by a validator
    const hosts = [await worker('--host', `m=${model}:0-1`), await worker('--host', `m=${model}:2-3`)];
    await waitFor('the hosted model complete', async () => (await listModels(user, on(b))).models.some((m) => m.name === 'm' && m.complete), 20_000);
    const ends = await loadModel(model);
    const want = await generate(ends, ends.tokenizer!.encode('The swarm'), { maxNewTokens: 40, temperature: 0 });
    const height = async (v: Running) => ((await request(user, on(v), { type: 'ledger-show' })) as { height: number }).height;
    const generation = spawn(process.execPath, [BIN, 'generate', '--model', 'm', '--bootstrap', boot, '--ends', model, '--prompt', 'The swarm',
      '--max-new-tokens', '40', '--verify', 'exact', '--verify-rate', '1', '--json', '--backend', 'js'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let killed: Promise<{ generating: boolean; height: number }> | null = null;
    generation.stdout.on('data', (d) => (out += d));
    generation.stderr.on('data', (d) => {
      err += d;
      // the session is routed (its first step under way, each step checked by A): A is SIGKILLed
      killed ??= /blocks on/.test(err)
        ? (async () => {
            const generating = generation.exitCode === null;
            a.child.kill('SIGKILL');
            await new Promise((r) => a.child.once('exit', r));
            return { generating, height: await height(b) };
          })()
        : null;
    });
    await waitFor('A killed mid-generation', async () => killed !== null && a.child.signalCode === 'SIGKILL', 60_000);
    const atKill = await killed!;
    assert.ok(atKill.generating, 'the generation was under way');
    // training goes on: its disputes, ledger and re-plans go to B now
    for (const batch of all.slice(2)) losses.push((await trainer.step(batch)).loss);
    const code = await new Promise<number | null>((r) => (generation.exitCode === null ? generation.once('exit', r) : r(generation.exitCode)));
    assert.equal(code, 0, err);
    const result = JSON.parse(out) as { tokens: number[]; verification: { checked: number; failed: number; unchecked: number } };

    assert.deepEqual(result.tokens, want.tokens, 'the generation\'s tokens are one process\'s');
    process.stderr.write(`A SIGKILLed mid-generation (ledger height ${atKill.height}) and mid-training: tokens and losses equal one process's; `
      + `every step re-run (${result.verification.checked} checks, ${result.verification.unchecked} unchecked)\n`);
    assert.ok(result.verification.checked > 0 && result.verification.failed === 0, JSON.stringify(result.verification));
    assert.equal(result.verification.unchecked, 0, 'every step was re-run: by A, then by B once A was gone');
    assert.deepEqual(losses, expected, 'the training\'s losses are one process\'s');
    assert.deepEqual(dm.verification!.flagged, [cheater]);
    assert.ok(!dm.assignment.some((x) => x.peerId === cheater), 'the cheater left the job');

    // B and C: every worker listed, the cheater excluded, the two of them as the set's validators; blocks signed by both
    const ids = [...plain, ...hosts].map((w) => w.peerId).sort();
    for (const v of [b, c]) {
      const { value: peers } = await waitFor('the view of the two left', async () => {
        const seen = await listPeers(user, on(v));
        return validatorIds(seen).length === 2 && workerIds(seen).length === 6 ? seen : null;
      }, 20_000);
      assert.deepEqual(workerIds(peers), ids);
      assert.deepEqual(validatorIds(peers), [b.peerId, c.peerId].sort());
      assert.equal(peers.find((p) => p.peerId === cheater)?.excluded, true);
      assert.ok(peers.filter((p) => p.roles.includes('worker') && p.peerId !== cheater).every((p) => p.excluded !== true));
    }
    await trainer.settle();
    assert.equal(await dm.verifier!.drain(), null, 'the ledger took every record (B once A was gone)');
    const now = await height(b);
    assert.ok(now > atKill.height, `blocks made after A was killed (height ${atKill.height} → ${now})`);
    const last = (await request(user, on(c), { type: 'ledger-show', height: now - 1 })) as { block: { signatures: string[] } };
    assert.ok(last.block.signatures.length >= 2, JSON.stringify(last.block.signatures));
  });
});
