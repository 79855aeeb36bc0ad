import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { type Abi, type Account, type Address, BaseError, ContractFunctionRevertedError, type Hex, keccak256, parseEventLogs, toHex } from 'viem';
import { mnemonicToAccount } from 'viem/accounts';
import { ANVIL_MNEMONIC, type LocalChain, startAnvil } from '../../src/chain/anvil.ts';
import { ARTIFACTS_FILE, compileContracts } from '../../src/chain/compile.ts';
import { artifacts, type ChainClients, clients, type Contracts, deployContracts } from '../../src/chain/deploy.ts';
import { escrowKey, jobKey, userKey } from '../../src/chain/node-chain.ts';
import { RewardTree } from '../../src/chain/reward-tree.ts';
import { Generator } from '../../src/tensor/index.ts';

const SUPPLY = 10n ** 24n;
const DELAY = 3600;
const account = (i: number) => mnemonicToAccount(ANVIL_MNEMONIC, { addressIndex: i });
const deployer = account(0);
const validators = [account(1), account(2), account(3)];
const workers = [account(4), account(5), account(6)];
const user = account(7);
const art = artifacts();

/** The custom error a call reverted with ('' when it did not revert). */
async function revertOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return '';
  } catch (err) {
    const e = err instanceof BaseError ? err.walk((x) => x instanceof ContractFunctionRevertedError) : null;
    if (e instanceof ContractFunctionRevertedError) return e.data?.errorName ?? e.reason ?? 'reverted';
    throw err;
  }
}

describe('contracts: compiled artifacts', () => {
  test('the committed artifacts are what solc-js compiles from the sources', () => {
    const committed = JSON.parse(readFileSync(ARTIFACTS_FILE, 'utf8'));
    assert.deepEqual(committed, JSON.parse(JSON.stringify(compileContracts())), 'run npm run contracts after changing a contract');
  });
});

describe('contracts on a real chain (anvil), through viem', () => {
  let chain: LocalChain;
  let c: ChainClients;
  let k: Contracts;

  const read = (address: Address, name: string, functionName: string, args: unknown[] = []) =>
    c.publicClient.readContract({ address, abi: art[name].abi, functionName, args }) as Promise<unknown>;
  /** Sends a call from `from` (simulated first, so a revert names its error) and waits for it. */
  const write = async (from: Account, address: Address, name: string, functionName: string, args: unknown[] = []) => {
    const { request } = await c.publicClient.simulateContract({ account: from, address, abi: art[name].abi, functionName, args });
    const hash = await c.wallet(from).writeContract(request);
    const receipt = await c.publicClient.waitForTransactionReceipt({ hash });
    assert.equal(receipt.status, 'success');
    return receipt;
  };
  const balance = (a: Address) => read(k.token, 'TensorLinkToken', 'balanceOf', [a]) as Promise<bigint>;
  const pass = async (seconds: number) => {
    await c.publicClient.request({ method: 'evm_increaseTime' as never, params: [seconds] as never });
    await c.publicClient.request({ method: 'evm_mine' as never, params: [] as never });
  };
  /** The validators' signatures of a digest, in ascending order of address (as the contract wants them). */
  const sign = async (digest: Hex, by: typeof validators) => {
    const sorted = [...by].sort((a, b) => (a.address.toLowerCase() < b.address.toLowerCase() ? -1 : 1));
    return Promise.all(sorted.map((v) => v.signMessage({ message: { raw: digest } })));
  };

  before(async () => {
    chain = await startAnvil();
    c = clients(chain.rpc, chain.chainId);
    k = await deployContracts(chain.rpc, chain.chainId, deployer, {
      supply: SUPPLY, validators: validators.map((v) => v.address), threshold: 2, unstakeDelay: DELAY, refundAfter: 7 * 86_400,
    });
    for (const a of [...workers, user]) await write(deployer, k.token, 'TensorLinkToken', 'transfer', [a.address, 10n ** 21n]);
  });
  after(async () => {
    await chain?.stop();
  });

  test('the token: transfers and allowances, and no spending past either', async () => {
    const [a, b] = workers;
    const before = await balance(b.address);
    await write(a, k.token, 'TensorLinkToken', 'transfer', [b.address, 5n]);
    assert.equal(await balance(b.address), before + 5n);
    assert.equal(await revertOf(write(a, k.token, 'TensorLinkToken', 'transfer', [b.address, 10n ** 30n])), 'ERC20InsufficientBalance');
    await write(a, k.token, 'TensorLinkToken', 'approve', [user.address, 100n]);
    await write(user, k.token, 'TensorLinkToken', 'transferFrom', [a.address, user.address, 60n]);
    assert.equal(await read(k.token, 'TensorLinkToken', 'allowance', [a.address, user.address]), 40n);
    assert.equal(await revertOf(write(user, k.token, 'TensorLinkToken', 'transferFrom', [a.address, user.address, 41n])), 'ERC20InsufficientAllowance');
    assert.equal(await read(k.token, 'TensorLinkToken', 'totalSupply'), SUPPLY);
  });

  test('staking: an unstake waits its delay; only the multisig slashes', async () => {
    const w = workers[0];
    await write(w, k.token, 'TensorLinkToken', 'approve', [k.staking, 1000n]);
    await write(w, k.staking, 'Staking', 'stake', [1000n]);
    assert.equal(await read(k.staking, 'Staking', 'stakeOf', [w.address]), 1000n);
    await write(w, k.staking, 'Staking', 'requestUnstake', [400n]);
    assert.equal(await revertOf(write(w, k.staking, 'Staking', 'withdraw')), 'Locked');
    assert.equal(await revertOf(write(w, k.staking, 'Staking', 'requestUnstake', [601n])), 'Insufficient');
    await pass(DELAY + 1);
    const before = await balance(w.address);
    await write(w, k.staking, 'Staking', 'withdraw');
    assert.equal(await balance(w.address), before + 400n);
    assert.equal(await revertOf(write(deployer, k.staking, 'Staking', 'slash', [w.address, 1n, keccak256(toHex('x'))])), 'NotSettlement');
    assert.equal(await revertOf(write(validators[0], k.staking, 'Staking', 'slash', [w.address, 1n, keccak256(toHex('x'))])), 'NotSettlement');
  });

  test('slashing: 2 of 3 validators cut a stake (pending unstakes too) with the evidence hash; a signature set is good once', async () => {
    const w = workers[1];
    await write(w, k.token, 'TensorLinkToken', 'approve', [k.staking, 500n]);
    await write(w, k.staking, 'Staking', 'stake', [500n]);
    await write(w, k.staking, 'Staking', 'requestUnstake', [200n]);
    const evidence = keccak256(toHex('a record whose re-execution failed'));
    const nonce = await read(k.settlement, 'Settlement', 'slashNonce') as bigint;
    const digest = await read(k.settlement, 'Settlement', 'slashDigest', [w.address, 450n, evidence, nonce]) as Hex;
    assert.equal(await revertOf(write(user, k.settlement, 'Settlement', 'slash', [w.address, 450n, evidence, await sign(digest, validators.slice(0, 1))])), 'NotEnoughSignatures');
    const one = await sign(digest, validators.slice(0, 1));
    assert.equal(await revertOf(write(user, k.settlement, 'Settlement', 'slash', [w.address, 450n, evidence, [...one, ...one]])), 'NotEnoughSignatures');
    const sigs = await sign(digest, validators.slice(1));
    const pool = await balance(k.settlement);
    await write(user, k.settlement, 'Settlement', 'slash', [w.address, 450n, evidence, sigs]);
    const [staked, pending] = await read(k.staking, 'Staking', 'stakes', [w.address]) as [bigint, bigint, bigint];
    assert.deepEqual([staked, pending], [0n, 50n]);
    assert.equal(await balance(k.settlement), pool + 450n, 'the cut goes to the reward pool');
    assert.equal(await revertOf(write(user, k.settlement, 'Settlement', 'slash', [w.address, 450n, evidence, sigs])), 'NotEnoughSignatures');
  });

  test('escrow: bound to the job and the user who runs it; only its payer adds to it', async () => {
    const peer = '12D3KooWUserPeerIdOfTheJob';
    const key = await read(k.escrow, 'Escrow', 'keyOf', [jobKey('job-0'), userKey(peer)]);
    assert.equal(key, escrowKey('job-0', peer), 'the chain and the validators name an escrow alike');
    await write(user, k.token, 'TensorLinkToken', 'approve', [k.escrow, 100n]);
    const receipt = await write(user, k.escrow, 'Escrow', 'deposit', [jobKey('job-0'), userKey(peer), 100n]);
    const [deposited] = parseEventLogs({ abi: art.Escrow.abi as Abi, logs: receipt.logs, eventName: 'Deposited' }) as unknown as { args: Record<string, unknown> }[];
    assert.deepEqual(deposited.args, { key, payer: user.address, job: jobKey('job-0'), user: userKey(peer), amount: 100n }, 'the chain says whose job it binds');
    assert.deepEqual((await read(k.escrow, 'Escrow', 'jobs', [key]) as [Address, bigint, bigint]).slice(0, 2), [user.address, 100n]);
    // someone else cannot add to (or take over) that user's escrow; the same job run by another user is another escrow
    await write(workers[0], k.token, 'TensorLinkToken', 'approve', [k.escrow, 20n]);
    assert.equal(await revertOf(write(workers[0], k.escrow, 'Escrow', 'deposit', [jobKey('job-0'), userKey(peer), 10n])), 'NotPayer');
    await write(workers[0], k.escrow, 'Escrow', 'deposit', [jobKey('job-0'), userKey('12D3KooWAnotherPeer'), 10n]);
    assert.deepEqual((await read(k.escrow, 'Escrow', 'jobs', [key]) as [Address, bigint, bigint]).slice(0, 2), [user.address, 100n]);
    const other = escrowKey('job-0', '12D3KooWAnotherPeer');
    assert.deepEqual((await read(k.escrow, 'Escrow', 'jobs', [other]) as [Address, bigint, bigint]).slice(0, 2), [workers[0].address, 10n]);
  });

  test('escrow and settlement: payments released only against a root 2 of 3 validators signed; each reward claimed once', async () => {
    const job = escrowKey('job-1', '12D3KooWUserPeerIdOfTheJob');
    await write(user, k.token, 'TensorLinkToken', 'approve', [k.escrow, 3000n]);
    await write(user, k.escrow, 'Escrow', 'deposit', [jobKey('job-1'), userKey('12D3KooWUserPeerIdOfTheJob'), 3000n]);
    assert.equal(await revertOf(write(user, k.escrow, 'Escrow', 'release', [job, 3000n])), 'NotSettlement');
    assert.equal(await revertOf(write(user, k.escrow, 'Escrow', 'refund', [job])), 'TooEarly');
    const rewards = new Map<Address, bigint>([[workers[0].address, 1500n], [workers[2].address, 1000n], [validators[0].address, 300n]]);
    const tree = new RewardTree(rewards);
    const epoch = 1n;
    const digest = await read(k.settlement, 'Settlement', 'settleDigest', [epoch, tree.root, tree.total, [job], [3000n]]) as Hex;
    const args = (sigs: Hex[]) => [epoch, tree.root, tree.total, [job], [3000n], sigs];
    assert.equal(await revertOf(write(user, k.settlement, 'Settlement', 'settle', args(await sign(digest, validators.slice(2))))), 'NotEnoughSignatures');
    const forged = await sign(digest, [validators[0], workers[0]] as never);
    assert.equal(await revertOf(write(user, k.settlement, 'Settlement', 'settle', args(forged))), 'NotEnoughSignatures');
    const poolBefore = await balance(k.settlement);
    await write(user, k.settlement, 'Settlement', 'settle', args(await sign(digest, [validators[0], validators[2]])));
    assert.equal(await balance(k.settlement), poolBefore + 3000n);
    assert.equal(await revertOf(write(user, k.settlement, 'Settlement', 'settle', args(await sign(digest, validators)))), 'AlreadySettled');
    for (const [a, amount] of rewards) {
      const before = await balance(a);
      assert.equal(await revertOf(write(user, k.settlement, 'Settlement', 'claim', [epoch, a, amount + 1n, tree.proof(a)])), 'BadProof');
      await write(user, k.settlement, 'Settlement', 'claim', [epoch, a, amount, tree.proof(a)]);
      assert.equal(await balance(a), before + amount);
      assert.equal(await revertOf(write(user, k.settlement, 'Settlement', 'claim', [epoch, a, amount, tree.proof(a)])), 'AlreadyClaimed');
    }
    assert.equal(await revertOf(write(user, k.settlement, 'Settlement', 'claim', [2n, user.address, 1n, []])), 'UnknownEpoch');
  });

  test('invariant: random sequences of calls conserve the supply, and every balance adds up', async () => {
    const rng = new Generator(11);
    const actors = [...workers, user];
    const pick = <T>(xs: readonly T[]) => xs[Math.floor(rng.uniform() * xs.length)];
    const amount = () => BigInt(Math.floor(rng.uniform() * 2000));
    const holders = [deployer, ...validators, ...actors].map((a) => a.address as Address);
    for (let i = 0; i < 60; i++) {
      const a = pick(actors);
      const calls: Record<string, () => Promise<unknown>> = {
        transfer: () => write(a, k.token, 'TensorLinkToken', 'transfer', [pick(actors).address, amount()]),
        stake: async () => {
          const n = amount();
          await write(a, k.token, 'TensorLinkToken', 'approve', [k.staking, n]);
          await write(a, k.staking, 'Staking', 'stake', [n]);
        },
        unstake: () => write(a, k.staking, 'Staking', 'requestUnstake', [amount()]),
        withdraw: () => write(a, k.staking, 'Staking', 'withdraw'),
        deposit: async () => {
          const n = amount();
          await write(a, k.token, 'TensorLinkToken', 'approve', [k.escrow, n]);
          await write(a, k.escrow, 'Escrow', 'deposit', [keccak256(toHex(`job-${a.address}`)), keccak256(toHex(`user-${a.address}`)), n]);
        },
        spend: () => write(pick(actors), k.token, 'TensorLinkToken', 'transferFrom', [a.address, user.address, amount()]),
      };
      const call = calls[pick(Object.keys(calls))]();
      await revertOf(call); // a call past a balance, allowance or delay reverts and changes nothing
      if (rng.uniform() < 0.1) await pass(DELAY);
      if (i % 10 === 9 || i === 59) {
        const all = await Promise.all([...holders, k.staking, k.escrow, k.settlement, k.token].map((h) => balance(h)));
        assert.equal(all.reduce((x, y) => x + y, 0n), SUPPLY, `after call ${i}`);
        assert.equal(await read(k.token, 'TensorLinkToken', 'totalSupply'), SUPPLY);
      }
    }
  });
});
