// Issue #34's acceptance: browser tabs as workers. The validator (a CLI process) serves /lend; headless Chromium tabs
// open it with `?start=1&memory=256MiB`, and each becomes a worker of its own (its libp2p in the page, a slot on the
// validator's relay, WebRTC to its peers). With one Node worker (a CLI process), the user of this process runs a
// generation and a training step across all three, equal to one process bit for bit (js); the validator re-executes
// the tabs' records; a tab of the test build that cheats is caught; a tab closed mid-generation fails over.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { multiaddr } from '@multiformats/multiaddr';
import { type Browser, chromium, type Page } from 'playwright-core';
import { localSwarm, type LocalSwarm } from '../../src/swarm/index.ts';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, generate, gpt2Config, HFTokenizer, LocalTrainer } from '../../src/models/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { pathTo } from '../../src/p2p/webrtc.ts';
import { listWorkers } from '../../src/user/peers.ts';
import { waitFor } from '../helpers/processes.ts';

/** Debian's Chromium (`apt-get install chromium`, as .ci/run does). */
const CHROMIUM = '/usr/bin/chromium';
const OUTPUT = fileURLToPath(new URL('../../test-output/', import.meta.url));
/** A request's deadline in these tests: far past any step on a loaded machine (a lost worker is found by its closed streams). */
const NO_DEADLINE_MS = 120_000;
/** The page with its cheating switch (`?fault=`): built beside dist/lend/ by scripts/build-dashboard.mjs, served by nobody. */
const TEST_BUILD = fileURLToPath(new URL('../../dist/lend-test/app.js', import.meta.url));

interface Tab {
  page: Page;
  peerId: string;
  errors: string[];
}

describe('browser tabs as workers: Chromium tabs and a Node worker serve one job', { skip: existsSync(CHROMIUM) ? false : `${CHROMIUM} is missing` }, () => {
  setBackend('js');
  let swarm: LocalSwarm;
  let browser: Browser;
  const tabs: Tab[] = [];
  /** Opens /lend in a tab of its own, which starts lending at once; resolves once it serves (its relay slot taken). */
  const openTab = async (query = '', build: 'production' | 'test' = 'production'): Promise<Tab> => {
    const context = await browser.newContext(); // its own IndexedDB: its own key, a worker of its own
    const page = await context.newPage();
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    if (build === 'test') await page.route('**/lend/app.js', (route) => route.fulfill({ path: TEST_BUILD, contentType: 'text/javascript' }));
    await page.goto(`${swarm.dashboard}/lend?start=1&memory=256MiB${query}`);
    await page.locator('#lending[data-state="serving"]').waitFor({ timeout: 60_000 }).catch(async () => {
      throw new Error(`the tab did not start serving: ${await page.locator('#lend-panel').innerText()} ${errors.join('; ')}`);
    });
    const tab = { page, peerId: (await page.locator('#self').getAttribute('data-peer'))!, errors };
    tabs.push(tab);
    return tab;
  };
  /** Waits until the validator lists exactly these workers. */
  const listed = async (peers: string[]) => {
    const want = [...peers].sort().join();
    await waitFor(`the validator to list ${peers.length} workers`, async () => {
      const now = (await listWorkers(swarm.user.node, multiaddr(swarm.bootstrap))).map((p) => p.peerId).sort().join();
      return now === want;
    }, 30_000);
  };
  before(async () => {
    swarm = await localSwarm({ workers: 1, backend: 'js', dashboard: '127.0.0.1:0', handleSignals: false });
    // loopback peer connections are refused by default: a swarm on one machine needs them
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--allow-loopback-in-peer-connection'] });
    await openTab();
    await openTab();
    await listed([swarm.workers[0].peerId, tabs[0].peerId, tabs[1].peerId]);
  });
  after(async () => {
    await browser?.close();
    await swarm?.close();
  });

  const config = gpt2Config({ vocabSize: 64, hidden: 32, layers: 6, heads: 4, maxPositions: 128 });
  const prompt = [3, 1, 4, 1, 5, 9, 2, 6];
  type Sampling = { maxNewTokens: number; stopTokens: number[]; temperature: number; seed: number };
  /**
   * One process's tokens for a seeded model, and a job of the same model planned over the workers listed now. A worker
   * is taken for lost when it closes or dies, never for being slow: two tabs and a swarm on two cores are slow, and a
   * deadline missed there would fail over a healthy worker (the tokens the same, the failovers and checks not).
   */
  const job = async (seed: number, options: Sampling, sampleRate: number) => {
    const model = createModel(config, { seed });
    const expected = (await generate(model, prompt, options)).tokens;
    return { expected, dm: await swarm.user.distribute(model, { strategy: 'parameter-balanced', verify: { sampleRate }, deadlineFloorMs: NO_DEADLINE_MS }) };
  };

  test('a generation across two tabs and a Node worker gives one process\'s tokens; the validator re-runs every record and all pass', async (t) => {
    const options = { maxNewTokens: 16, stopTokens: [], temperature: 0.8, seed: 5 };
    const { expected, dm } = await job(22, options, 1);
    try {
      const holders = dm.assignment.map((a) => a.peerId);
      // the tabs announce their engine: the js backend with its GEMM in WebAssembly (the js backend's bits)
      const listedNow = await listWorkers(swarm.user.node, multiaddr(swarm.bootstrap));
      for (const tab of tabs) {
        const c = listedNow.find((p) => p.peerId === tab.peerId)?.capabilities;
        assert.equal(c?.backend, 'browser-wasm');
        assert.equal(c?.memoryBytes, 256 * 2 ** 20, 'the memory the visitor lent');
      }
      assert.deepEqual([...holders].sort(), [swarm.workers[0].peerId, tabs[0].peerId, tabs[1].peerId].sort(), 'a section on each worker');
      const started = Date.now();
      assert.deepEqual((await dm.generate(prompt, options)).tokens, expected);
      // every record of the session re-executed by the validator, the tabs' among them (a tab records under its own key):
      // 3 a token, no worker lost
      assert.deepEqual(dm.failovers, []);
      await waitFor('every record re-executed', async () => dm.verification!.checked === 3 * options.maxNewTokens, 30_000).catch((err: Error) => {
        throw new Error(`${err.message}: ${JSON.stringify(dm.verification)}`);
      });
      const v = dm.verification!;
      assert.equal(v.failed, 0, JSON.stringify(v));
      assert.deepEqual(v.flagged, []);
      const rtc: number[] = [];
      for (const tab of tabs) {
        await tab.page.locator('#lending[data-sections="1"]').waitFor({ timeout: 5_000 });
        assert.ok(Number(await tab.page.locator('#lending').getAttribute('data-steps')) >= options.maxNewTokens, 'the tab counts what it served');
        // one connection per peer, reused (Chrome allows a tab about 500 RTCPeerConnections in its life)
        rtc.push(Number(await tab.page.locator('#lending').getAttribute('data-rtc')));
      }
      const name = (p: string) => (p === swarm.workers[0].peerId ? 'node' : 'tab');
      // the user's own connections to each worker: to a tab, WebRTC signalled through the relay (or the relay itself)
      const paths = holders.map((p) => `${name(p)} ${pathTo(swarm.user.node, p) ?? 'no connection'}`).join(', ');
      t.diagnostic(`${options.maxNewTokens} tokens in ${Date.now() - started} ms across ${holders.map(name).join(' → ')} (the user reaches: ${paths}); `
        + `${v.checked} records re-executed, 0 failed; RTCPeerConnections each tab created: ${rtc.join(', ')}`);
      for (const n of rtc) assert.ok(n <= 8, `a tab created ${n} RTCPeerConnections for 4 peers`);
      mkdirSync(OUTPUT, { recursive: true });
      await tabs[0].page.screenshot({ path: `${OUTPUT}lend-serving.png`, fullPage: true });
    } finally {
      await dm.close();
    }
  });

  test('a training step across them gives one process\'s loss, bit for bit', async () => {
    const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
    const trainConfig = gpt2Config({ vocabSize: 257, hidden: 32, layers: 6, heads: 4, maxPositions: 32 });
    const steps = 2;
    const reference = new LocalTrainer(createModel(trainConfig, { seed: 5 }), { lr: 3e-3, totalSteps: steps, microBatches: 2 });
    const local = (() => {
      const task = additionTask({ seed: 2 });
      const rng = new Generator(7);
      return Array.from({ length: steps }, () => reference.step(taskBatch(task, tok, rng, 8, 256)).loss);
    })();
    const dm = await swarm.user.distribute(createModel(trainConfig, { seed: 5 }), { strategy: 'parameter-balanced', training: true });
    try {
      assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 3);
      const trainer = await dm.trainer({ optimizer: { lr: 3e-3 }, totalSteps: steps, microBatches: 2, schedule: '1f1b' });
      const task = additionTask({ seed: 2 });
      const rng = new Generator(7);
      for (let s = 0; s < steps; s++) assert.equal((await trainer.step(taskBatch(task, tok, rng, 8, 256))).loss, local[s], `step ${s + 1}`);
    } finally {
      await dm.close();
    }
  });

  test('closing a tab mid-generation: the job fails over and finishes with one process\'s tokens', async (t) => {
    const options = { maxNewTokens: 24, stopTokens: [], temperature: 0.8, seed: 3 };
    const { expected, dm } = await job(23, options, 0);
    try {
      const victim = tabs.find((tab) => dm.assignment.some((a) => a.peerId === tab.peerId))!;
      tabs.splice(tabs.indexOf(victim), 1);
      let count = 0;
      const { tokens } = await dm.generate(prompt, {
        ...options,
        // the next step waits for the tab to be closed: on a loaded machine Chromium may take longer to close it than
        // the job takes to finish, and the generation would then never meet the closed tab
        onToken: async () => {
          if (++count === 8) await victim.page.context().close();
        },
      });
      assert.deepEqual(tokens, expected);
      assert.equal(dm.failovers.length, 1, JSON.stringify(dm.failovers));
      assert.equal(dm.failovers[0].peer, victim.peerId);
      assert.ok(!dm.assignment.some((a) => a.peerId === victim.peerId));
      t.diagnostic(`the closed tab's layers [${dm.failovers[0].layers}) ${dm.failovers[0].action === 'spare' ? 'moved to a spare' : 'replanned'} `
        + `in ${dm.failovers[0].recoveredMs} ms: ${dm.failovers[0].cause}`);
    } finally {
      await dm.close();
    }
  });

  test('a tab that cheats (the test build\'s ?fault=noise) is caught by the validator\'s re-execution', async (t) => {
    const cheater = await openTab('&fault=noise', 'test');
    await listed([swarm.workers[0].peerId, ...tabs.map((tab) => tab.peerId)]);
    // one job: a worker is replaced when it is caught (or closes), never for being slow, so the cheater's records are
    // re-run before anything could fail it over
    const dm = await swarm.user.distribute(createModel(config, { seed: 24 }), {
      strategy: 'parameter-balanced', verify: { sampleRate: 1 }, deadlineFloorMs: NO_DEADLINE_MS,
    });
    try {
      assert.ok(dm.assignment.some((a) => a.peerId === cheater.peerId), 'the cheating tab holds a section');
      const outcome = await dm.generate(prompt, { maxNewTokens: 4, stopTokens: [], temperature: 0 }).then(
        (r) => `tokens ${JSON.stringify(r.tokens)}`,
        (err: Error) => `${err.name}: ${err.message}`,
      );
      await waitFor('the cheating tab to be flagged', async () => dm.verification!.flagged.includes(cheater.peerId), 30_000).catch((err: Error) => {
        throw new Error(`${err.message}: the generation gave ${outcome}; verification ${JSON.stringify(dm.verification)}`);
      });
      const v = dm.verification!;
      t.diagnostic(`generation with the cheater: ${outcome}; verification ${JSON.stringify(v)}`);
      assert.ok(v.failed >= 1);
      // the only worker replaced is the cheater, for what it was caught at
      for (const f of dm.failovers) assert.equal(f.peer, cheater.peerId, JSON.stringify(dm.failovers));
    } finally {
      await dm.close();
    }
    for (const tab of tabs) assert.deepEqual(tab.errors, [], `tab ${tab.peerId}`);
  });
});
