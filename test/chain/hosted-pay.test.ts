// Issue #31: with a chain, a user of a hosted model pays per verified token from escrow, by the FLOPs of the sections
// that served it. Two worker processes host the two blocks of a model init-model made; `generate --model --contracts --pay`
// deposits into the user's escrow for the model, hands every step the hosts signed to the ledger, and the epoch pays
// each host from that escrow. `tensorlink rl --pay` over the same hosts (#51): the rollouts' decoding steps and the
// adapter's training are in the ledger, paid from the RL job's escrow.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { multiaddr } from '@multiformats/multiaddr';
import type { Address } from 'viem';
import { MIN_STAKE, PRICE_PER_FLOP } from '../../src/chain/index.ts';
import { LOCAL_GRANT, type LocalSwarm, localSwarm } from '../../src/swarm/index.ts';
import { generate, loadModel } from '../../src/models/index.ts';
import { parseStatusAnswer, request } from '../../src/p2p/index.ts';
import { listModels } from '../../src/user/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { waitFor } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
const TLK = 10n ** 18n;

describe('a hosted model, paid on a chain', () => {
  let swarm: LocalSwarm | null = null;
  const home = mkdtempSync(join(tmpdir(), 'tl-hosted-pay-'));
  after(async () => {
    await swarm?.close();
    rmSync(home, { recursive: true, force: true });
  });

  /** `tensorlink ...args --json` as a user whose home (its chain key) is `home`. */
  const cli = (...args: string[]): Record<string, unknown> => {
    const r = spawnSync(process.execPath, [BIN, ...args, '--json'], { encoding: 'utf8', timeout: 120_000, env: { ...process.env, HOME: home } });
    assert.equal(r.status, 0, r.stderr);
    return JSON.parse(r.stdout) as Record<string, unknown>;
  };

  test('generate --model --contracts --pay: every step the hosts signed is in the ledger, and the epoch pays each host its FLOPs from the user\'s escrow; '
    + 'so is `tensorlink rl` over the same hosts: its rollouts\' decoding steps and its training, from its job\'s escrow', async () => {
    setBackend('js');
    const dir = join(home, 'tiny');
    cli('init-model', '--arch', 'llama', '--layers', '2', '--hidden', '64', '--heads', '4', '--kv-heads', '2', '--max-positions', '128', '--out', dir, '--seed', '3');
    swarm = await localSwarm({
      workers: 2, chain: true, backend: 'js', threads: 1,
      workerArgs: [['--host', `tiny=${dir}:0-0`], ['--host', `tiny=${dir}:1-1`]],
    });
    const chain = swarm.chain!;
    const boot = multiaddr(swarm.bootstrap);
    const user = swarm.user.node;
    await waitFor('both hosts staked and the model served whole', async () => {
      const peers = parseStatusAnswer(await request(user, boot, { type: 'status' })).peers.filter((p) => p.roles.includes('worker'));
      const { models } = await listModels(user, boot);
      return peers.length === 2 && peers.every((p) => p.stake === MIN_STAKE.toString()) && models[0]?.complete === true;
    }, 30_000);

    // the user's account (its key under HOME), funded by the operator
    const account = cli('account', '--data', join(home, '.tensorlink', 'user'), '--contracts', chain.file).account as Address;
    await chain.fund(account);
    const maxNewTokens = 12;
    const got = cli(
      'generate', '--model', 'tiny', '--bootstrap', swarm.bootstrap, '--ends', dir, '--contracts', chain.file, '--pay', '5',
      '--max-new-tokens', String(maxNewTokens), '--temperature', '0', '--backend', 'js', '--verify-rate', '0.2', '--prompt', 'a hosted',
    );
    const local = await loadModel(dir);
    const want = await generate(local, local.tokenizer!.encode('a hosted'), { maxNewTokens, temperature: 0 });
    assert.deepEqual(got.tokens, want.tokens, 'the tokens of one process');
    const recorded = got.recorded as { records: number; flops: number; escrow: { job: string; user: string } };
    // one record per host per step: the prompt's step and one per new token but the last, on each of the two hosts
    assert.equal(recorded.records, 2 * (want.tokens.length));
    assert.match(recorded.escrow.job, /^host_tiny_[0-9a-f]{12}$/);
    const deposit = 5n * TLK;
    assert.equal((await chain.user.escrowOf(recorded.escrow.job, recorded.escrow.user)).amount, deposit);

    // the ledger holds every step, each accepted by the user; the epoch releases FLOPs × price from the user's escrow
    const show = cli('ledger', 'show', '--bootstrap', swarm.bootstrap);
    assert.equal(show.records, recorded.records);

    // reinforcement learning over the same hosts (#51), paid into its job's escrow: an adapter trained by GRPO, the
    // hosts generating its rollouts
    const task = join(home, 'short.mjs');
    writeFileSync(task, 'export const prompts = ["ab", "cd", "ef", "gh"];\nexport const maxNewTokens = 3;\n'
    + 'export function reward(prompt, completion) { return completion.length / 3; }\n');
    const ran = cli(
      'rl', '--task', task, '--model', 'tiny', '--bootstrap', swarm.bootstrap, '--contracts', chain.file, '--pay', '5',
      '--steps', '2', '--prompts', '2', '--group', '4', '--preset', 'dapo', '--backend', 'js', '--verify-rate', '0.2',
    );
    const rlEscrow = ran.escrow as { job: string; user: string };
    assert.equal(rlEscrow.job, ran.jobId);
    assert.equal((await chain.user.escrowOf(rlEscrow.job, rlEscrow.user)).amount, deposit);
    // what it added to the ledger, block by block: the rollouts' decoding steps, the adapter's passes and steps (asked
    // as `ledger show` asks, from this process's node: a CLI process a poll and a block would cost a second of CPU each;
    // `ledger show --height` is test/chain/settlement.test.ts's)
    const ledgerShow = (height?: number) => request(user, boot, { type: 'ledger-show', ...(height === undefined ? {} : { height }) });
    const { value: shown } = await waitFor('the run\'s records in blocks', async () => {
      const now = await ledgerShow();
      return (now.pending as number) === 0 && (now.height as number) > (show.height as number) ? now : null;
    }, 30_000);
    type Row = { kind: string; flops: number };
    const rows: Row[] = [];
    for (let h = show.height as number; h < (shown.height as number); h++) {
      rows.push(...((await ledgerShow(h)).block as { records: Row[] }).records);
    }
    const kinds = new Map<string, number>();
    for (const r of rows) kinds.set(r.kind, (kinds.get(r.kind) ?? 0) + 1);
    for (const kind of ['decode', 'forward', 'backward', 'step']) assert.ok((kinds.get(kind) ?? 0) > 0, `${kind} records: ${JSON.stringify([...kinds])}`);

    const settled = cli('ledger', 'settle', '--bootstrap', swarm.bootstrap);
    const due = BigInt(recorded.flops) * PRICE_PER_FLOP;
    assert.ok(due < deposit);
    assert.equal((await chain.user.escrowOf(recorded.escrow.job, recorded.escrow.user)).amount, deposit - due, 'the escrow paid the steps\' FLOPs');
    const rlDue = BigInt(rows.reduce((n, r) => n + r.flops, 0)) * PRICE_PER_FLOP;
    assert.equal((await chain.user.escrowOf(rlEscrow.job, rlEscrow.user)).amount, deposit - rlDue, 'the RL job\'s escrow paid its FLOPs');
    process.stderr.write(`rl paid: ${[...kinds].map(([k, n]) => `${n} ${k}`).join(', ')} records; ${rlDue} token units released from its job's escrow\n`);
    const rewards = settled.rewards as Record<string, string>;
    for (const w of swarm.workers) {
      const reward = BigInt(rewards[w.account!] ?? '0');
      assert.ok(reward > 0n, `host ${w.peerId} was paid`);
      await waitFor(`${w.peerId} to claim`, async () => (await chain.user.balanceOf(w.account as Address)) === LOCAL_GRANT - MIN_STAKE + reward, 90_000);
    }
    process.stderr.write(`hosted model paid: ${recorded.records} steps, ${recorded.flops} FLOPs, ${due} token units released from the user's escrow; host rewards ${swarm.workers.map((w) => rewards[w.account!]).join(', ')}\n`);
  });
});
