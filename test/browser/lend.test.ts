// Issue #34, the browser's side of the network: the validator serves /lend, and a headless Chromium tab runs libp2p,
// dials the validator over WebRTC-direct (Node listens on a UDP port beside TCP; the address carries its certificate's
// hash) and reads the registry with the control protocol, as any peer does. The page lists the swarm's workers. The
// engine, bundled for the tab, runs in a Web Worker: the seeded reference forward's logits equal Node's bit for bit.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { basename, extname, join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { type Browser, chromium } from 'playwright-core';
import { localSwarm, type LocalSwarm } from '../../src/swarm/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { referenceLogits } from '../../src/worker/engine-check.ts';

/** Debian's Chromium (`apt-get install chromium`, as .ci/run does). */
const CHROMIUM = '/usr/bin/chromium';
const OUTPUT = fileURLToPath(new URL('../../test-output/', import.meta.url));

describe('/lend: the swarm from a browser tab\'s own libp2p, in Debian\'s Chromium', { skip: existsSync(CHROMIUM) ? false : `${CHROMIUM} is missing` }, () => {
  let swarm: LocalSwarm;
  let browser: Browser;
  before(async () => {
    swarm = await localSwarm({ workers: 2, backend: 'js', dashboard: '127.0.0.1:0', handleSignals: false });
    // loopback peer connections are refused by default: a swarm on one machine needs them
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--allow-loopback-in-peer-connection'] });
  });
  after(async () => {
    await browser?.close();
    await swarm?.close();
  });

  test('the tab dials the validator over WebRTC-direct, lists the workers, and its engine computes Node\'s logits to the bit', async () => {
    // the CLI's validator and workers listen for browsers beside TCP: TCP addresses first in their ready lines
    const kinds = swarm.validator.addrs.map((a) => (a.includes('/webrtc-direct/') ? 'webrtc-direct' : a.includes('/ws/') ? 'ws' : 'tcp'));
    assert.deepEqual([...new Set(kinds)], ['tcp', 'webrtc-direct', 'ws'], swarm.validator.addrs.join(', '));
    const page = await browser.newPage();
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(`${swarm.dashboard}/lend`);
    const rows = page.locator('table[data-testid="workers"] tbody tr');
    await rows.nth(1).waitFor({ timeout: 30_000 }).catch(async () => {
      throw new Error(`the page says: ${await page.locator('#status').innerText()} ${errors.join('; ')}`);
    });
    assert.equal(await rows.count(), 2);
    for (const w of swarm.workers) assert.equal(await page.locator(`tr[data-peer="${w.peerId}"]`).count(), 1, `worker ${w.peerId} listed`);
    const via = await page.locator('[data-field="via"]').innerText();
    assert.match(via, /over webrtc-direct: \/ip4\/127\.0\.0\.1\/udp\/\d+\/webrtc-direct\//);
    assert.equal(await page.locator('tr[data-peer] td').nth(1).innerText(), 'private');
    // the engine, bundled for the tab, runs in a Web Worker and computes the seeded forward's logits to the bit
    const fingerprint = page.locator('#fingerprint[data-sha256]');
    await fingerprint.waitFor({ timeout: 60_000 }).catch(async () => {
      throw new Error(`the engine says: ${await page.locator('#engine').innerText()}`);
    });
    setBackend('js');
    const logits = referenceLogits();
    const here = createHash('sha256').update(new Uint8Array(logits.buffer, logits.byteOffset, logits.byteLength)).digest('hex');
    assert.equal(await fingerprint.getAttribute('data-sha256'), here, 'the tab\'s logits equal this process\'s, bit for bit');
    // and with its GEMM in WebAssembly SIMD (browser-wasm): the same bits
    assert.equal(await fingerprint.getAttribute('data-wasm-sha256'), here, 'the tab\'s WebAssembly GEMM gives the same logits');
    const wasmGflops = Number(await page.locator('#engine').getAttribute('data-wasm-gflops'));
    const tabGflops = Number(await page.locator('#engine').getAttribute('data-gflops'));
    // the tab's key lives in its IndexedDB: the same peer after a reload
    const peer = await page.locator('#self').getAttribute('data-peer');
    assert.match(peer ?? '', /^12D3KooW/);
    await page.reload();
    await page.locator('#self[data-peer]').waitFor({ timeout: 30_000 });
    assert.equal(await page.locator('#self').getAttribute('data-peer'), peer, 'the same peer id after a reload');
    process.stderr.write(`tab: ${tabGflops.toFixed(2)} GFLOP/s on the js backend, ${wasmGflops.toFixed(2)} with the WebAssembly GEMM; `
      + `logits SHA-256 ${here.slice(0, 16)}… equal to Node's\n`);
    assert.ok(tabGflops > 0);
    mkdirSync(OUTPUT, { recursive: true });
    await page.screenshot({ path: `${OUTPUT}lend.png`, fullPage: true });
    assert.deepEqual(errors, []);
  });

  test('built as static files: dist/lend/ served by any web server, the validator named by ?validator=', async () => {
    const dir = fileURLToPath(new URL('../../dist/lend/', import.meta.url));
    const types: Record<string, string> = { '.html': 'text/html', '.js': 'text/javascript' };
    // a plain file server, nothing of TensorLink's: /lend/ and /lend/NAME are the files of dist/lend/
    const server = createServer((req, res) => {
      const name = (req.url ?? '/').split('?')[0].replace(/^\/lend\/?/, '') || 'index.html';
      const path = join(dir, basename(name));
      if (!existsSync(path)) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { 'content-type': types[extname(path)] ?? 'application/octet-stream' }).end(readFileSync(path));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const { port } = server.address() as AddressInfo;
      const webrtc = swarm.validator.addrs.find((a) => a.includes('/webrtc-direct/'))!;
      const page = await browser.newPage();
      await page.goto(`http://127.0.0.1:${port}/lend/?validator=${encodeURIComponent(webrtc)}`);
      const rows = page.locator('table[data-testid="workers"] tbody tr');
      await rows.nth(1).waitFor({ timeout: 30_000 }).catch(async () => {
        throw new Error(`the page says: ${await page.locator('#status').innerText()}`);
      });
      assert.equal(await rows.count(), 2);
      assert.match(await page.locator('[data-field="via"]').innerText(), /over webrtc-direct/);
      await page.close();
    } finally {
      server.close();
    }
  });

  test('a tab asked to lend more than its heap holds says so and does not join', async () => {
    const page = await browser.newPage();
    await page.goto(`${swarm.dashboard}/lend?start=1&memory=64GiB`);
    await page.locator('#lend-state .err').waitFor({ timeout: 30_000 });
    assert.match(await page.locator('#lend-state').innerText(), /^this tab can lend at most \d+ MiB \(three quarters of its JavaScript heap\), not 64GiB$/);
    assert.equal(await page.locator('#lending').getAttribute('data-state'), 'idle');
    await page.close();
  });
});
