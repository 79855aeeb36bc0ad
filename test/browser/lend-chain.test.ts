// Issue #34's keys and pay: a tab lending to a swarm that settles on a chain (anvil). Its account key lives in the tab's
// IndexedDB; unfunded, the page says it has no stake and the validator gives it no work; funded (the visitor's business:
// here the test sends tokens and gas), it stakes by itself, serves a training job beside a Node worker, and once the
// epoch settles it claims its reward, which the page shows.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { multiaddr } from '@multiformats/multiaddr';
import { type Browser, chromium, type Page } from 'playwright-core';
import type { Address } from 'viem';
import { MIN_STAKE } from '../../src/chain/index.ts';
import { LOCAL_GRANT, localSwarm, type LocalSwarm } from '../../src/swarm/index.ts';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer } from '../../src/models/index.ts';
import { parseStatusAnswer, request } from '../../src/p2p/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { listWorkers } from '../../src/user/peers.ts';
import { waitFor } from '../helpers/processes.ts';

const CHROMIUM = '/usr/bin/chromium';
const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

describe('a tab on a swarm that pays on a chain', { skip: existsSync(CHROMIUM) ? false : `${CHROMIUM} is missing` }, () => {
  setBackend('js');
  let swarm: LocalSwarm;
  let browser: Browser;
  let page: Page;
  before(async () => {
    swarm = await localSwarm({ workers: 1, chain: true, backend: 'js', dashboard: '127.0.0.1:0', handleSignals: false });
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--allow-loopback-in-peer-connection'] });
    page = await browser.newPage();
    await page.goto(`${swarm.dashboard}/lend?start=1&memory=256MiB`);
  });
  after(async () => {
    await browser?.close();
    await swarm?.close();
  });

  test('unfunded it has no stake and no work; funded it stakes, serves a job and claims what it earned', async (t) => {
    const earnings = page.locator('#lend-earnings');
    await page.locator('#lend-earnings[data-staked="false"]').waitFor({ timeout: 60_000 });
    const account = (await earnings.getAttribute('data-account')) as Address;
    assert.match(account, /^0x[0-9a-fA-F]{40}$/);
    const said = /no stake: account 0x[0-9a-fA-F]{40} holds 0 TLK and no ether for gas; a worker is given work once 100 TLK/;
    assert.match(await earnings.innerText(), said);
    const peerId = (await page.locator('#self').getAttribute('data-peer'))!;
    const boot = multiaddr(swarm.bootstrap);
    // the registry knows the tab (and its account) but gives it no work: it has no stake
    await waitFor('the tab in the registry with its account', async () => {
      const { peers } = parseStatusAnswer(await request(swarm.user.node, boot, { type: 'status' }));
      return peers.some((p) => p.peerId === peerId && p.account?.toLowerCase() === account.toLowerCase());
    }, 20_000);
    assert.ok(!(await listWorkers(swarm.user.node, boot)).some((p) => p.peerId === peerId), 'no work for a tab without stake');

    const chain = swarm.chain!;
    await chain.fund(account);
    await page.locator('#lend-earnings[data-staked="true"]').waitFor({ timeout: 30_000 });
    assert.equal(await chain.user.stakeOf(account), MIN_STAKE);
    await waitFor('the staked tab to be given work', async () => (await listWorkers(swarm.user.node, boot)).some((p) => p.peerId === peerId), 20_000);

    // a paid training job across the Node worker and the tab
    const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
    const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 4, heads: 4, maxPositions: 32 });
    const job = await swarm.user.distribute(createModel(config, { seed: 5 }), { strategy: 'parameter-balanced', verify: { sampleRate: 0.2, seed: 3 } });
    assert.ok(job.assignment.some((a) => a.peerId === peerId), 'the tab holds a section');
    await chain.user.deposit(job.jobId, swarm.user.node.peerId.toString(), 50n * 10n ** 18n);
    const trainer = await job.trainer({ optimizer: { lr: 3e-3 }, totalSteps: 2, microBatches: 2 });
    const task = additionTask({ seed: 2 });
    const rng = new Generator(7);
    for (let s = 0; s < 2; s++) await trainer.step(taskBatch(task, tok, rng, 4, 256));
    await job.settle();
    await job.close();
    const settle = spawnSync(process.execPath, [BIN, 'ledger', 'settle', '--bootstrap', swarm.bootstrap, '--json'], { encoding: 'utf8', timeout: 120_000 });
    assert.equal(settle.status, 0, settle.stderr);
    const rewards = (JSON.parse(settle.stdout) as { rewards: Record<string, string> }).rewards;
    const reward = BigInt(Object.entries(rewards).find(([a]) => a.toLowerCase() === account.toLowerCase())?.[1] ?? '0');
    assert.ok(reward > 0n, `the tab earned: ${JSON.stringify(rewards)}`);
    // the tab claims by itself, and the page shows it
    await waitFor('the tab to claim', async () => (await chain.user.balanceOf(account)) === LOCAL_GRANT - MIN_STAKE + reward, 30_000);
    await page.locator(`#lend-earnings[data-claimed="${reward}"]`).waitFor({ timeout: 10_000 });
    t.diagnostic(`the tab's account ${account}: staked 100 TLK, claimed ${Number(reward) / 1e18} TLK; the page says: ${await earnings.innerText()}`);
  });
});
