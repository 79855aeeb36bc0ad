// Issue #46's acceptance for the tab on its GPU: headless Chromium tabs given WebGPU (SwiftShader, a Vulkan GPU in
// software, behind --enable-unsafe-webgpu) open /lend and choose browser-webgpu: each session's steps of their sections
// run as one graph each on onnxruntime-web's WebGPU provider. Two such tabs and a Node worker (js) serve a greedy
// generation (and a sampled one) equal to one process's tokens; the validator re-runs the tabs' records within
// onnxruntime's tolerance.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { multiaddr } from '@multiformats/multiaddr';
import { type Browser, chromium, type Page } from 'playwright-core';
import { localSwarm, type LocalSwarm } from '../../src/swarm/index.ts';
import { createModel, generate, gpt2Config } from '../../src/models/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { listWorkers } from '../../src/user/peers.ts';
import { waitFor } from '../helpers/processes.ts';

/** Debian's Chromium (`apt-get install chromium`, as .ci/run does). */
const CHROMIUM = '/usr/bin/chromium';

interface Tab {
  page: Page;
  peerId: string;
  errors: string[];
}

describe('browser tabs on their GPU (browser-webgpu) and a Node worker serve one generation', { skip: existsSync(CHROMIUM) ? false : `${CHROMIUM} is missing` }, () => {
  setBackend('js');
  let swarm: LocalSwarm;
  let browser: Browser;
  const tabs: Tab[] = [];
  /** Opens /lend in a tab of its own, which starts lending at once; resolves once it serves (its relay slot taken). */
  const openTab = async (): Promise<Tab> => {
    const context = await browser.newContext(); // its own IndexedDB: its own key, a worker of its own
    const page = await context.newPage();
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    // SwiftShader is slower than the tab's WebAssembly, so the tab would choose that: ?engine=webgpu asks for the GPU
    await page.goto(`${swarm.dashboard}/lend?start=1&memory=256MiB&engine=webgpu`);
    await page.locator('#lending[data-state="serving"]').waitFor({ timeout: 120_000 }).catch(async () => {
      throw new Error(`the tab did not start serving: ${await page.locator('#lend-panel').innerText()} ${errors.join('; ')}`);
    });
    // no silent skip: a tab that found no adapter (or whose provider did not start) says why, and the test fails
    const backend = await page.locator('#lending').getAttribute('data-backend');
    if (backend !== 'browser-webgpu') {
      throw new Error(`the tab computes on ${backend}, not browser-webgpu: ${await page.locator('#engine').innerText()}`);
    }
    const tab = { page, peerId: (await page.locator('#self').getAttribute('data-peer'))!, errors };
    tabs.push(tab);
    return tab;
  };
  before(async () => {
    swarm = await localSwarm({ workers: 1, backend: 'js', dashboard: '127.0.0.1:0', handleSignals: false });
    // WebGPU on an http://localhost page: SwiftShader's adapter where the machine has no GPU
    browser = await chromium.launch({
      executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--allow-loopback-in-peer-connection', '--enable-unsafe-webgpu'],
    });
    await openTab();
    await openTab();
    const want = [swarm.workers[0].peerId, ...tabs.map((t) => t.peerId)].sort().join();
    await waitFor('the validator to list 3 workers', async () => {
      const now = (await listWorkers(swarm.user.node, multiaddr(swarm.bootstrap))).map((p) => p.peerId).sort().join();
      return now === want;
    }, 30_000);
  });
  after(async () => {
    await browser?.close();
    await swarm?.close();
  });

  test('a greedy generation across two tabs on WebGPU and a Node worker gives one process\'s tokens; the tabs say browser-webgpu', async (t) => {
    const config = gpt2Config({ vocabSize: 64, hidden: 32, layers: 6, heads: 4, maxPositions: 128 });
    const prompt = [3, 1, 4, 1, 5, 9, 2, 6];
    const options = { maxNewTokens: 12, stopTokens: [], temperature: 0 };
    // and sampled (its draws seeded): tokens that change along the way, so a step that read its cache wrong would show
    const sampled = { maxNewTokens: 12, stopTokens: [], temperature: 0.8, seed: 5 };
    const model = createModel(config, { seed: 22 });
    const expected = (await generate(model, prompt, options)).tokens;
    const expectedSampled = (await generate(model, prompt, sampled)).tokens;
    const listed = await listWorkers(swarm.user.node, multiaddr(swarm.bootstrap));
    for (const tab of tabs) {
      assert.equal(listed.find((p) => p.peerId === tab.peerId)?.capabilities?.backend, 'browser-webgpu', 'the tab announces its GPU');
      assert.match(await tab.page.locator('#engine').innerText(), /browser-webgpu, onnxruntime-web's WebGPU provider on /);
    }
    // a worker is taken for lost when it closes or dies, never for being slow (SwiftShader compiles each graph's shaders
    // on the CPU of a loaded machine: a deadline missed there would fail over a healthy tab)
    const dm = await swarm.user.distribute(model, { strategy: 'parameter-balanced', verify: { sampleRate: 1 }, deadlineFloorMs: 120_000 });
    const failovers = () => dm.failovers.map((f) => `${f.action} [${f.layers}) of ${f.peer.slice(-6)}: ${f.cause}`).join('; ') || 'none';
    try {
      const holders = dm.assignment.map((a) => a.peerId);
      assert.deepEqual([...holders].sort(), [swarm.workers[0].peerId, ...tabs.map((x) => x.peerId)].sort(), 'a section on each worker');
      const started = Date.now();
      assert.deepEqual((await dm.generate(prompt, options)).tokens, expected);
      const ms = Date.now() - started;
      assert.deepEqual((await dm.generate(prompt, sampled)).tokens, expectedSampled);
      // every record observed is re-run by the validator (sampleRate 1), the tabs' within onnxruntime's tolerance
      const observed = () => Object.values(dm.verification!.byBackend).reduce((a, b) => a + b, 0);
      await waitFor('every record re-executed', async () => dm.verification!.checked + dm.verification!.unchecked >= observed(), 60_000)
        .catch((err: Error) => {
          throw new Error(`${err.message}: ${JSON.stringify(dm.verification)}; failovers: ${failovers()}`);
        });
      const v = dm.verification!;
      assert.equal(v.failed, 0, JSON.stringify(v));
      assert.deepEqual(v.flagged, []);
      assert.deepEqual(dm.failovers, [], failovers());
      // each tab's records: one a token of each generation
      assert.equal(v.byBackend['browser-webgpu'], tabs.length * (options.maxNewTokens + sampled.maxNewTokens), JSON.stringify(v.byBackend));
      for (const tab of tabs) {
        assert.equal(await tab.page.locator('#lending').getAttribute('data-backend'), 'browser-webgpu');
        assert.match(await tab.page.locator('#lend-state').innerText(), /on browser-webgpu/);
        assert.deepEqual(tab.errors, [], `tab ${tab.peerId}`);
      }
      t.diagnostic(`greedy ${JSON.stringify(expected)}, sampled ${JSON.stringify(expectedSampled)}; ${options.maxNewTokens} greedy tokens in ${ms} ms; `
        + `records by backend ${JSON.stringify(v.byBackend)}; ${v.checked} re-executed, 0 failed; failovers: ${failovers()}; `
        + `engine: ${await tabs[0].page.locator('#engine').innerText()}`);
    } finally {
      await dm.close();
    }
  });
});
