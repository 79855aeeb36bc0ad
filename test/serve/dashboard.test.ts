import assert from 'node:assert/strict';
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { type Browser, chromium, type Page } from 'playwright-core';
import { localSwarm, type LocalSwarm } from '../../src/swarm/index.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
/** Debian's Chromium (`apt-get install chromium`, as .ci/run does). */
const CHROMIUM = '/usr/bin/chromium';
/** Where the test leaves its screenshots for people to look at. */
const OUTPUT = fileURLToPath(new URL('../../test-output/', import.meta.url));

/** How many worker rows the page shows now. */
const workerRows = (page: Page) => page.locator('table[data-testid="peers"] tr[data-role="worker"]').count();

async function until<T>(what: string, probe: () => Promise<T>, ok: (v: T) => boolean, timeoutMs = 60_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: T | undefined;
  while (Date.now() < end) {
    last = await probe().catch(() => undefined as T);
    if (last !== undefined && ok(last)) return last;
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`${what}: still ${JSON.stringify(last)} after ${timeoutMs} ms`);
}

describe('the dashboard of a local swarm, in Debian\'s Chromium (playwright-core)', { skip: existsSync(CHROMIUM) ? false : `${CHROMIUM} is missing (apt-get install chromium)` }, () => {
  let swarm: LocalSwarm;
  let browser: Browser;
  let train: ChildProcess | null = null;
  const root = mkdtempSync(join(tmpdir(), 'tensorlink-dashboard-'));

  before(async () => {
    swarm = await localSwarm({ workers: 3, backend: 'js', dashboard: '127.0.0.1:0', handleSignals: false });
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
  });
  after(async () => {
    train?.kill('SIGKILL');
    await browser?.close();
    await swarm?.close();
    rmSync(root, { recursive: true, force: true });
  });

  test('lists the workers, shows a training job moving, and loses a worker that is killed', async () => {
    assert.ok(swarm.dashboard, 'the validator serves a dashboard');
    const model = join(root, 'gpt');
    const made = spawnSync(process.execPath, [BIN, 'init-model', '--arch', 'gpt2', '--layers', '3', '--hidden', '32', '--heads', '4', '--max-positions', '32', '--out', model]);
    assert.equal(made.status, 0, String(made.stderr));
    // a user in its own process trains across the swarm (long enough to outlast the test)
    train = spawn(process.execPath, [BIN, 'train', '--model', model, '--task', 'addition', '--steps', '5000', '--batch', '8', '--micro-batches', '2',
      '--lr', '0.003', '--eval-every', '100000', '--backend', 'js', '--bootstrap', swarm.bootstrap], { stdio: ['ignore', 'ignore', 'pipe'] });
    let trainErr = '';
    train.stderr!.on('data', (d) => (trainErr += d));

    const page = await browser.newPage({ viewport: { width: 1440, height: 1100 } });
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(`${swarm.dashboard}/`);
    await until('worker rows', () => workerRows(page), (n) => n === 3);
    for (const w of swarm.workers) assert.equal(await page.locator(`tr[data-peer="${w.peerId}"]`).count(), 1, `worker ${w.peerId} is listed`);
    // a swarm on one machine: every worker is reached at its own private (loopback) address
    assert.equal(await page.locator(`tr[data-peer="${swarm.workers[0].peerId}"] td[data-field="reach"]`).innerText(), 'private');

    // the job appears with its plan, and its step moves while the page is open
    const job = page.locator('article[data-job][data-kind="train"]');
    const step = () => job.locator('[data-field="step"]').innerText().then(Number);
    const first = await until(`a training job (train says: ${trainErr.slice(-300)})`, step, (s) => s >= 1, 90_000);
    const later = await until('the step moving', step, (s) => s >= first + 3, 60_000);
    assert.ok(later > first);
    assert.match(await job.locator('[data-field="loss"]').innerText(), /^\d+\.\d{4}$/);
    const planned = await job.locator('[data-worker]').evaluateAll((els) => els.map((e) => e.getAttribute('data-worker')));
    assert.ok(planned.length >= 1 && planned.every((p) => swarm.workers.some((w) => w.peerId === p)), 'the plan names the swarm\'s workers');
    assert.equal(await job.locator('[data-testid="loss-chart"] canvas').count(), 1, 'the loss is plotted');
    mkdirSync(OUTPUT, { recursive: true });
    await page.screenshot({ path: join(OUTPUT, 'dashboard.png'), fullPage: true });
    // /metrics has the same figures for Prometheus
    const running = await (await fetch(`${swarm.dashboard}/metrics`)).text();
    assert.match(running, /^tensorlink_job_step\{job_id="[^"]+",owner="[^"]+",kind="train",state="running"\} \d+$/m);
    // the training has shown what it had to: it stops here rather than compute through the wait below
    train.kill('SIGKILL');

    // a worker outside the job's plan is killed: its row goes (the validator forgets a silent peer within its TTL)
    const victim = swarm.workers.find((w) => !planned.includes(w.peerId)) ?? swarm.workers[swarm.workers.length - 1];
    victim.process.kill('SIGKILL');
    await until('the killed worker gone', () => page.locator(`tr[data-peer="${victim.peerId}"]`).count(), (n) => n === 0, 40_000);
    assert.equal(await workerRows(page), 2);
    assert.ok(await page.locator('[data-testid="events"] .event.left').count() >= 1, 'its leaving is an event');
    await page.screenshot({ path: join(OUTPUT, 'dashboard-worker-left.png'), fullPage: true });
    assert.deepEqual(errors, [], 'no script error on the page');

    const metrics = await (await fetch(`${swarm.dashboard}/metrics`)).text();
    assert.match(metrics, /^tensorlink_peers\{role="worker"\} 2$/m);
  });
});
