import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describe, test } from 'node:test';
import { type EpochRecord, epochRewards, escrowJobOf, type JobEscrow, paidWork } from '../../src/ledger/index.ts';
import { hostedJobId, hostedModelJob, replannedJobId } from '../../src/p2p/index.ts';
import { Generator } from '../../src/tensor/index.ts';

const PRICE = 1_000_000n;
const accounts: Record<string, string> = { honest: '0xAAAA', other: '0xBBBB', cheater: '0xCCCC' };
const accountOf = (peer: string) => accounts[peer];
/** Escrows by `job\nuser`: the user's paid job, the cheater's own job, and a job the cheater paid for under a second peer id. */
const escrows = new Map<string, JobEscrow>([
  ['job\nuser', { payer: '0x1111', held: 10n ** 20n }],
  ['fake\ncheater', { payer: '0xcccc', held: 10n ** 20n }],
  ['fake2\ncheater-2', { payer: '0xcccc', held: 10n ** 20n }],
  ['small\nuser', { payer: '0x1111', held: 3n * 1000n * PRICE }],
]);
const escrowOf = (job: string, user: string) => escrows.get(`${job}\n${user}`);

describe('ledger: which work an epoch pays', () => {
  test('only records the escrow\'s own user accepted are paid; a worker\'s own job, a job it paid for, and records nobody accepted are not', () => {
    const honest: EpochRecord[] = [
      { peer: 'honest', job: 'job', user: 'user', flops: 4000 },
      { peer: 'other', job: 'job', user: 'user', flops: 1000 },
    ];
    const fake: EpochRecord[] = [
      { peer: 'cheater', job: 'fake', user: 'cheater', flops: 1e9 }, // the worker is the job's user
      { peer: 'cheater', job: 'fake2', user: 'cheater-2', flops: 1e9 }, // the worker's account paid the escrow
      { peer: 'cheater', job: 'job', user: 'cheater', flops: 1e9 }, // a paid job's records handed in by a peer that is not its user
      { peer: 'honest', job: 'job', user: 'cheater', flops: 4000 }, // someone else's records, accepted by the wrong peer
      { peer: 'cheater', job: 'job', flops: 1e9 }, // accepted by nobody
      { peer: 'cheater', job: 'nobody-paid', user: 'user', flops: 1e9 },
    ];
    const paid = paidWork([...fake.slice(0, 3), ...honest, ...fake.slice(3)], escrowOf, accountOf, PRICE);
    assert.deepEqual(paid.releases, [{ job: 'job', user: 'user', amount: 5000n * PRICE }]);
    assert.deepEqual(paid.work, new Map([['honest', 4000], ['other', 1000]]));
    assert.deepEqual(paidWork(honest, escrowOf, accountOf, PRICE), paid, 'the fake records change nothing');
  });

  test('a hosted span\'s records are paid from the user\'s escrow for the whole model; any other job\'s from its own', () => {
    const model = { name: 'llama-3.2', hash: 'ab'.repeat(32) };
    assert.equal(hostedModelJob(model), 'host_llama-3_2_abababababab');
    for (const layers of [[0, 0], [3, 11]] as [number, number][]) {
      assert.equal(escrowJobOf(hostedJobId({ ...model, layers })), hostedModelJob(model));
    }
    for (const job of ['job', 'host_x', 'host_llama_abababababab', 'job_ababababab12_0-1x']) assert.equal(escrowJobOf(job), job);
  });

  test('a job planned again (a worker caught) is paid from its first\'s escrow, and only by the user who paid into it', () => {
    const first = randomUUID();
    assert.match(replannedJobId(first, 1), new RegExp(`^${first}_r1_[0-9a-f]{8}$`));
    assert.match(replannedJobId(replannedJobId(first, 1), 2), new RegExp(`^${first}_r2_[0-9a-f]{8}$`));
    // not to be guessed: whoever opens a job id on a worker first holds it there
    assert.notEqual(replannedJobId(first, 1), replannedJobId(first, 1));
    for (const n of [1, 2, 17]) assert.equal(escrowJobOf(replannedJobId(first, n)), first);
    for (const job of [`${first}_r1`, `${first}_r_0123abcd`, `x${first}_r1_0123abcd`, 'job_r1_0123abcd']) assert.equal(escrowJobOf(job), job);
    // the records after the re-plan are paid from the deposit for the first job (each record's job read as the validators'
    // settlement reads it); another user's under the same names are not
    const paid = paidWork([
      { peer: 'honest', job: first, user: 'user', flops: 1000 },
      { peer: 'honest', job: replannedJobId(first, 1), user: 'user', flops: 2000 },
      { peer: 'other', job: replannedJobId(first, 1), user: 'thief', flops: 5000 },
    ].map((r) => ({ ...r, job: escrowJobOf(r.job) })), (job, user) => (job === first && user === 'user' ? { payer: '0x1111', held: 10_000n * PRICE } : undefined), accountOf, PRICE);
    assert.deepEqual(paid.releases, [{ job: first, user: 'user', amount: 3000n * PRICE }]);
    assert.deepEqual(paid.work, new Map([['honest', 3000]]));
  });

  test('an escrow that holds less than its work is due pays each of its records the share it covers', () => {
    const paid = paidWork([
      { peer: 'honest', job: 'small', user: 'user', flops: 4000 },
      { peer: 'other', job: 'small', user: 'user', flops: 2000 },
      { peer: 'other', job: 'job', user: 'user', flops: 500 },
    ], escrowOf, accountOf, PRICE);
    // 'small' holds 3000 FLOPs' worth of 6000 due: half of each record counts
    assert.deepEqual(paid.releases, [{ job: 'job', user: 'user', amount: 500n * PRICE }, { job: 'small', user: 'user', amount: 3000n * PRICE }]);
    assert.deepEqual(paid.work, new Map([['honest', 2000], ['other', 1500]]));
    assert.throws(() => paidWork([{ peer: 'x', job: 'job', user: 'user', flops: -1 }], escrowOf, accountOf, PRICE), { name: 'InvalidArgumentError' });
  });

  test('random epochs: fake records never change an honest worker\'s reward, and releases never pass what an escrow holds', () => {
    const rng = new Generator(9);
    const int = (n: number) => Math.floor(rng.uniform() * n);
    for (let t = 0; t < 200; t++) {
      const honest: EpochRecord[] = Array.from({ length: 1 + int(8) }, () => ({
        peer: ['honest', 'other'][int(2)], job: ['job', 'small'][int(2)], user: 'user', flops: int(5000),
      }));
      const fake: EpochRecord[] = Array.from({ length: int(8) }, () => {
        const choices: [string, string | undefined][] = [['fake', 'cheater'], ['fake2', 'cheater-2'], ['job', 'cheater'], ['job', undefined], ['none', 'user']];
        const [job, user] = choices[int(5)];
        // the cheater's own records, or an honest worker's records handed in by someone other than the job's user
        const peer = job === 'job' && rng.uniform() < 0.5 ? 'honest' : 'cheater';
        return { peer, job, user, flops: int(1e9) };
      });
      const mixed = [...honest, ...fake].sort(() => rng.uniform() - 0.5);
      const a = paidWork(honest, escrowOf, accountOf, PRICE);
      const b = paidWork(mixed, escrowOf, accountOf, PRICE);
      assert.deepEqual(b, a);
      for (const r of b.releases) assert.ok(r.amount <= escrowOf(r.job, r.user)!.held);
      const pool = 10n ** 18n + b.releases.reduce((x, r) => x + r.amount, 0n);
      const workers = [...b.work].map(([peer, work]) => ({ account: accounts[peer], work, reputation: 1 }));
      const rewards = epochRewards(pool, 1000, workers, [{ account: 'v', blocks: 1 }]).rewards;
      assert.equal(rewards.get(accounts.cheater), undefined, 'the cheater earns nothing');
    }
  });
});
