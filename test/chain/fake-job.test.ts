import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { mnemonicToAccount } from 'viem/accounts';
import { ANVIL_MNEMONIC, deployContracts, type LocalChain, NodeChain, PRICE_PER_FLOP, startAnvil } from '../../src/chain/index.ts';
import { acceptRecord, epochRewards, type LedgerRecord } from '../../src/ledger/index.ts';
import { createNode, request, signerOf, type TensorLinkNode } from '../../src/p2p/index.ts';
import { startValidator, type Validator } from '../../src/validator/index.ts';
import { VALIDATOR_SHARE_BPS } from '../../src/validator/settlement.ts';
import { signRecord, type WorkRecord } from '../../src/verify/index.ts';

const TLK = 10n ** 18n;
const account = (i: number) => mnemonicToAccount(ANVIL_MNEMONIC, { addressIndex: i });
const H = (c: string) => c.repeat(64);

describe('ledger and chain: a fake job earns nothing from the common pool', () => {
  let chain: LocalChain | null = null;
  let validator: Validator | null = null;
  const nodes: TensorLinkNode[] = [];
  after(async () => {
    for (const n of nodes) await n.stop();
    await validator?.stop();
    await chain?.stop();
  });

  test('a worker that pays for its own job earns nothing; a paid job\'s records handed in by another peer are not paid; the honest worker\'s share is the formula\'s', async () => {
    chain = await startAnvil();
    const [deployer, validatorAccount, userAccount, cheaterAccount, honestAccount] = [0, 1, 2, 3, 4].map(account);
    const contracts = await deployContracts(chain.rpc, chain.chainId, deployer, {
      supply: 10n ** 27n, validators: [validatorAccount.address], threshold: 1, unstakeDelay: 3600, refundAfter: 86_400,
    });
    const deployment = { rpc: chain.rpc, chainId: chain.chainId, contracts };
    const on = (a: ReturnType<typeof account>) => new NodeChain(deployment, a);
    const bank = on(deployer);
    for (const a of [userAccount, cheaterAccount]) await bank.write('token', 'transfer', [a.address, 100n * TLK]);
    // the common pool: what the settlement contract holds unowed (slashed stake, carried rounding)
    const common = 30n * TLK;
    await bank.write('token', 'transfer', [contracts.settlement, common]);

    validator = await startValidator({ listen: ['/ip4/127.0.0.1/tcp/0'], chain: on(validatorAccount) });
    const target = validator.node.getMultiaddrs()[0];
    // the honest user and worker; the cheater, a worker, and a second peer id of its own
    const [user, honest, cheater, cheater2] = await Promise.all([0, 1, 2, 3].map(() => createNode()));
    nodes.push(user, honest, cheater, cheater2);
    const id = (n: TensorLinkNode) => n.peerId.toString();
    for (const [n, a] of [[honest, honestAccount], [cheater, cheaterAccount]] as const) {
      await request(n, target, { type: 'announce', roles: ['worker'], account: a.address });
    }

    let seq = 0;
    const records = (worker: TensorLinkNode, job: string, n: number, flops: number): WorkRecord[] => Array.from({ length: n }, (_, i) => (
      signRecord({
        job, step: i, micro: 0, stage: [0, 1], kind: 'forward', input: H('a'), output: H('b'), weights: H('c'), backend: 'js', seq: seq++, flops,
      }, signerOf(worker))
    ));
    const submit = async (from: TensorLinkNode, rs: LedgerRecord[]) => {
      const a = await request(from, target, { type: 'ledger-submit', records: rs }, 30_000);
      return { accepted: a.accepted, refused: a.refused, duplicate: a.duplicate };
    };
    const accepted = (rs: WorkRecord[], by: TensorLinkNode) => rs.map((r) => acceptRecord(r, signerOf(by)));

    // the user pays for its job, bound to its own peer id; the cheater pays for two fake jobs: one run by itself, one by its second peer id
    await on(userAccount).deposit('job', id(user), 10n * TLK);
    await on(cheaterAccount).deposit('fake', id(cheater), 10n * TLK);
    await on(cheaterAccount).deposit('fake2', id(cheater2), 10n * TLK);

    const honestWork = records(honest, 'job', 4, 10 ** 12);
    // before the user hands them in, the cheater hands in the honest records as its own acceptance: not paid, and not in the way
    assert.deepEqual(await submit(cheater, accepted(honestWork, cheater)), { accepted: 4, refused: 0, duplicate: 0 });
    assert.deepEqual(await submit(user, accepted(honestWork, user)), { accepted: 4, refused: 0, duplicate: 0 });
    // the cheater's fake work (100× the honest FLOPs): for its own job, for the job of its second peer id, and for the user's paid job
    assert.deepEqual(await submit(cheater, accepted(records(cheater, 'fake', 4, 10 ** 14), cheater)), { accepted: 4, refused: 0, duplicate: 0 });
    assert.deepEqual(await submit(cheater2, accepted(records(cheater, 'fake2', 4, 10 ** 14), cheater2)), { accepted: 4, refused: 0, duplicate: 0 });
    const onPaidJob = records(cheater, 'job', 4, 10 ** 14);
    assert.deepEqual(await submit(cheater, accepted(onPaidJob, cheater)), { accepted: 4, refused: 0, duplicate: 0 });
    // an acceptance in the user's name that the user did not sign is refused outright
    const forged = accepted(onPaidJob, cheater).map((r) => ({ ...r, by: { user: id(user), sig: r.by!.sig } }));
    assert.deepEqual(await submit(cheater, forged), { accepted: 0, refused: 4, duplicate: 0 });

    const settled = await request(user, target, { type: 'ledger-settle' }, 60_000);
    const honestFlops = 4 * 10 ** 12;
    const released = BigInt(honestFlops) * PRICE_PER_FLOP;
    // what the formula pays with the honest work alone: the fake jobs change nothing
    const expected = epochRewards(common + released, VALIDATOR_SHARE_BPS, [
      { account: honestAccount.address, work: honestFlops, reputation: validator.reputation.standing(id(honest)).score },
    ], [{ account: validatorAccount.address, blocks: settled.to as number }]);
    assert.deepEqual(settled.rewards, Object.fromEntries([...expected.rewards].map(([a, v]) => [a, v.toString()])));
    assert.equal((settled.rewards as Record<string, string>)[cheaterAccount.address], undefined, 'the cheater earns nothing');
    assert.ok(expected.rewards.get(honestAccount.address)! > common / 2n, 'the honest worker takes the common pool');
    // only the user's escrow released, for the honest work; the cheater's escrows are whole, to be refunded to it and nothing more
    const escrow = async (job: string, peer: TensorLinkNode) => (await bank.escrowOf(job, id(peer))).amount;
    assert.equal(await escrow('job', user), 10n * TLK - released);
    assert.equal(await escrow('fake', cheater), 10n * TLK);
    assert.equal(await escrow('fake2', cheater2), 10n * TLK);
    assert.equal(await escrow('job', cheater), 0n);
    // a stranger to the validators' set closes no second epoch at once (each is a transaction), and signs nothing for them
    await assert.rejects(request(user, target, { type: 'ledger-settle' }, 60_000), { name: 'RateLimitedError', message: /ask again in/ });
    const input = { epoch: '1', from: 0, to: 1, reputations: {}, accounts: {}, validators: {} };
    await assert.rejects(request(cheater, target, { type: 'settle-sign', input }), { name: 'UnauthorizedError' });
    const slash = { record: onPaidJob[0], account: honestAccount.address, amount: '1', nonce: '0' };
    await assert.rejects(request(cheater, target, { type: 'slash-sign', ...slash }), { name: 'UnauthorizedError' });
  });
});
