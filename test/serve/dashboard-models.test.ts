// Issue #31: the dashboard shows the hosted models, their coverage and their sessions: the validator's overview carries
// the models index (hosts announce their open sessions per span), and the page draws a panel of it.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { describe, test } from 'node:test';
import { chromium } from 'playwright-core';
import { loadConfig } from '../../src/models/index.ts';
import { createNode, hostedJobId, type HostedModelEntry } from '../../src/p2p/index.ts';
import { serveDashboard } from '../../src/serve/index.ts';
import { fetchOverview, listModels, RemoteStage } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { parseHostSpec, startWorker } from '../../src/worker/index.ts';
import { randn, setBackend, tensor } from '../../src/tensor/index.ts';
import { readHFReference } from '../helpers/hf-fixtures.ts';
import { waitFor } from '../helpers/processes.ts';

/** Debian's Chromium (`apt-get install chromium`, as .ci/run does). */
const CHROMIUM = '/usr/bin/chromium';

describe('the dashboard\'s hosted models', () => {
  setBackend('js');

  test('the overview lists each model with its coverage, hosts and open sessions; the page shows them', async () => {
    const ref = readHFReference('llama3');
    const validator = await startValidator();
    const addr = validator.node.getMultiaddrs()[0];
    const boot = addr.toString();
    const hosts = [
      await startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${ref.dir}:0-0`)] }),
      await startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${ref.dir}:1-1`)] }),
    ];
    const user = await createNode();
    const dashboard = await serveDashboard({ overview: () => fetchOverview(user, addr) });
    let session: RemoteStage | null = null;
    try {
      const { models: [m] } = await listModels(user, addr);
      const first = m.hosts.find((h) => h.layers[0] === 0)!;
      // a session open on the first host's span
      const target = hosts.find((h) => h.node.peerId.toString() === first.peerId)!.node.getMultiaddrs()[0];
      session = await RemoteStage.attach(user, target, hostedJobId({ name: m.name, hash: m.hash, layers: first.layers }));
      await session.forward('s1', randn([1, 2, loadConfig(ref.dir).hidden], { seed: 1 }), tensor([0, 1], [1, 2], 'int32'), null);
      // the next announcement carries it
      const { value: shown } = await waitFor('the session in the overview', async () => {
        const state = await (await fetch(`${dashboard.url}/api/state`)).json() as { overview: { models?: HostedModelEntry[] } };
        const model = state.overview.models?.[0];
        return model?.hosts.some((h) => h.sessions === 1) ? model : null;
      }, 10_000);
      assert.equal(shown.name, 'llama3');
      assert.equal(shown.hash, m.hash);
      assert.equal(shown.complete, true);
      assert.deepEqual(shown.hosts.map((h) => [h.layers, h.format, h.state, h.sessions]).sort(), [[[0, 0], 'f32', 'online', 1], [[1, 1], 'f32', 'online', 0]]);
      if (existsSync(CHROMIUM)) {
        const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
        try {
          const page = await browser.newPage();
          await page.goto(dashboard.url);
          const panel = page.locator('article.model[data-model="llama3"]');
          await panel.waitFor({ timeout: 15_000 });
          assert.equal(await panel.getAttribute('data-hash'), m.hash);
          assert.equal((await panel.locator('[data-field="complete"]').textContent())?.trim(), 'complete');
          assert.equal((await panel.locator('[data-field="hosts"]').textContent())?.trim(), '2');
          assert.match((await panel.locator('[data-field="coverage"]').textContent()) ?? '', /2 \/ 2/);
          assert.equal((await panel.locator('[data-field="sessions"]').textContent())?.trim(), '1');
          assert.equal(await panel.locator('tr[data-host]').count(), 2);
        } finally {
          await browser.close();
        }
      }
      process.stderr.write(`dashboard: llama3 complete over 2 hosts, 1 open session shown${existsSync(CHROMIUM) ? ' (and drawn in Chromium)' : ''}\n`);
    } finally {
      await session?.close();
      await dashboard.close();
      await user.stop();
      await Promise.all(hosts.map((h) => h.stop()));
      await validator.stop();
    }
  });
});
