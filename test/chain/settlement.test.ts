import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { multiaddr } from '@multiformats/multiaddr';
import type { Address } from 'viem';
import { MIN_STAKE, PRICE_PER_FLOP } from '../../src/chain/index.ts';
import { LOCAL_GRANT, type LocalSwarm, localSwarm } from '../../src/swarm/index.ts';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { epochRewards } from '../../src/ledger/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer } from '../../src/models/index.ts';
import { parseStatusAnswer, request } from '../../src/p2p/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { VALIDATOR_SHARE_BPS } from '../../src/validator/settlement.ts';
import { waitFor } from '../helpers/processes.ts';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

/** `tensorlink ...args --json`: its JSON result (the test fails with its stderr otherwise). */
function cli(...args: string[]): Record<string, unknown> {
  const r = spawnSync(process.execPath, [BIN, ...args, '--json'], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Record<string, unknown>;
}

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 4, heads: 4, maxPositions: 32 });
const TLK = 10n ** 18n;

describe('ledger and chain, end to end on a local swarm', () => {
  let swarm: LocalSwarm | null = null;
  after(async () => {
    await swarm?.close();
  });

  test('a training job: every accepted record in the ledger, the epoch settled, each worker paid its share by the formula, the cheater slashed', async () => {
    setBackend('js');
    // four workers, one of them cheating on every computation; two copies of a two-section plan (redundancy 2)
    swarm = await localSwarm({ workers: 4, chain: true, backend: 'js', threads: 1, faults: [undefined, undefined, 'noise', undefined] });
    const chain = swarm.chain!;
    const cheater = swarm.workers[2];
    const boot = multiaddr(swarm.bootstrap);
    const status = async () => parseStatusAnswer(await request(swarm!.user.node, boot, { type: 'status' })).peers;
    // every worker staked as it started, and the validator sees it (a worker without stake would get no work)
    await waitFor('the workers to be staked', async () => {
      const peers = (await status()).filter((p) => p.roles.includes('worker'));
      return peers.length === 4 && peers.every((p) => p.stake === MIN_STAKE.toString());
    }, 30_000);

    const job = await swarm.user.distribute(createModel(config, { seed: 5 }), { strategy: 'parameter-balanced', verify: { redundancy: 2, sampleRate: 0.1, seed: 3 } });
    const payment = 50n * TLK;
    await chain.user.deposit(job.jobId, swarm.user.node.peerId.toString(), payment);
    const firstJob = job.jobId;
    const trainer = await job.trainer({ optimizer: { lr: 3e-3 }, totalSteps: 3, microBatches: 2 });
    const task = additionTask({ seed: 2 });
    const rng = new Generator(7);
    let last;
    for (let s = 0; s < 3; s++) last = await trainer.step(taskBatch(task, tok, rng, 4, 256));
    const verification = (await job.settle())!;
    assert.deepEqual(last!.verification.flagged, [cheater.peerId]);
    await job.close();

    // the ledger holds every record the user accepted, and none of the cheater's (as `tensorlink ledger show` prints it)
    const show = cli('ledger', 'show', '--bootstrap', swarm.bootstrap);
    assert.equal(show.records, verification.recorded);
    assert.ok(verification.recorded > 0);
    const work = show.work as Record<string, { records: number; flops: number }>;
    assert.equal(work[cheater.peerId], undefined, 'no record of the cheater was accepted');
    // any record's inclusion proof checks offline (`ledger proof`, then `ledger verify` with the validator named)
    const block = cli('ledger', 'show', '--bootstrap', swarm.bootstrap, '--height', '0').block as { records: { id: string }[] };
    const tmp = mkdtempSync(join(tmpdir(), 'tl-settle-'));
    try {
      const file = join(tmp, 'proof.json');
      const r = spawnSync(process.execPath, [BIN, 'ledger', 'proof', block.records[0].id, '--bootstrap', swarm.bootstrap, '--out', file], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      assert.equal(cli('ledger', 'verify', file, '--validators', swarm.validator.peerId).valid, true);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }

    // the cheater was slashed by the validators' multisig, with a failed re-execution as evidence
    const cheaterAccount = cheater.account as Address;
    await waitFor('the cheater to be slashed', async () => (await chain.user.stakeOf(cheaterAccount)) === MIN_STAKE / 2n, 30_000);

    // the epoch settles: what the formula gives, from the ledger's work, the validator's reputations and the pool
    const peersBefore = await status();
    const pool = MIN_STAKE / 2n + (() => {
      const flops = Object.values(work).reduce((a, w) => a + BigInt(w.flops), 0n);
      return flops * PRICE_PER_FLOP < payment ? flops * PRICE_PER_FLOP : payment;
    })();
    const settled = cli('ledger', 'settle', '--bootstrap', swarm.bootstrap);
    const blocks = Number(show.height);
    const workers = peersBefore.filter((p) => work[p.peerId]).map((p) => ({
      account: p.account!, work: work[p.peerId].flops, reputation: p.excluded ? 0 : p.reputation!,
    }));
    const expected = epochRewards(pool, VALIDATOR_SHARE_BPS, workers, [{ account: swarm.validator.account!, blocks }]);
    const rewards = settled.rewards as Record<string, string>;
    assert.deepEqual(
      Object.fromEntries(Object.entries(rewards).map(([a, v]) => [a.toLowerCase(), v])),
      Object.fromEntries([...expected.rewards].map(([a, v]) => [a.toLowerCase(), v.toString()])),
    );
    assert.equal(rewards[cheaterAccount], undefined, 'the cheater earns nothing');
    assert.equal(firstJob, job.jobId, 'the job kept its id (redundancy settled it without a re-plan)');

    // every honest worker claims its reward by itself: balanceOf shows grant − stake + reward
    for (const w of swarm.workers.filter((x) => x !== cheater)) {
      const reward = BigInt(rewards[w.account!] ?? '0');
      assert.ok(reward > 0n, `${w.peerId} earned`);
      await waitFor(`${w.peerId} to claim`, async () => (await chain.user.balanceOf(w.account as Address)) === LOCAL_GRANT - MIN_STAKE + reward, 30_000);
    }
    assert.equal(await chain.user.balanceOf(cheaterAccount), LOCAL_GRANT - MIN_STAKE);
    const after = (await status()).find((p) => p.peerId === swarm!.workers[0].peerId)!;
    await waitFor('status to show the claim', async () => {
      const p = (await status()).find((x) => x.peerId === swarm!.workers[0].peerId)!;
      return p.claimed === rewards[swarm!.workers[0].account!] && p.earned === p.claimed;
    }, 10_000);
    assert.ok(after.stake === MIN_STAKE.toString());
  });
});
