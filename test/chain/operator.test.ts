import assert from 'node:assert/strict';
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { waitFor } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
const running: ChildProcess[] = [];
const root = mkdtempSync(join(tmpdir(), 'tl-operator-'));
after(() => {
  for (const c of running) c.kill('SIGKILL');
  rmSync(root, { recursive: true, force: true });
});

/** `tensorlink ARGS --json`, run to its end: its JSON result. */
function cli(...args: string[]): Record<string, unknown> {
  const r = spawnSync(process.execPath, [BIN, ...args, '--json'], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, `tensorlink ${args.join(' ')}: ${r.stderr}`);
  return JSON.parse(r.stdout) as Record<string, unknown>;
}

/** `tensorlink ARGS`, left running: its ready line. */
function start(...args: string[]): Promise<Record<string, unknown>> {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  running.push(child);
  let out = '';
  let err = '';
  child.stderr.on('data', (d) => (err += d));
  return new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => {
      out += d;
      const line = out.split('\n').find((l) => l.includes('"event":"ready"'));
      if (line) resolve(JSON.parse(line) as Record<string, unknown>);
    });
    child.once('exit', (code) => reject(new Error(`tensorlink ${args[0]} exited ${code}: ${err}`)));
  });
}

const stakeOf = (bootstrap: string, peerId: string) => {
  const { peers } = cli('status', '--bootstrap', bootstrap) as { peers: { peerId: string; stake?: string }[] };
  return peers.find((p) => p.peerId === peerId)?.stake;
};

test('an operator runs a chain: accounts before the nodes, the validators as the multisig, a worker funded after it started stakes by itself; stake and fund', async () => {
  const [validatorDir, workerDir] = [join(root, 'validator'), join(root, 'worker')];
  const contracts = join(root, 'contracts.json');
  // the accounts the nodes will use, before they first run
  const validator = cli('account', '--data', validatorDir);
  assert.equal(validator.created, true);
  assert.match(String(validator.account), /^0x[0-9a-fA-F]{40}$/);
  assert.equal(cli('account', '--data', validatorDir).account, validator.account, 'the same key, found again');
  // the chain, with the validator's account as the settlement multisig
  const chain = await start('chain', '--validators', String(validator.account), '--out', contracts);
  assert.ok(chain.contracts);
  const v = await start('validator', '--listen', '/ip4/127.0.0.1/tcp/0', '--data', validatorDir, '--contracts', contracts);
  assert.equal(v.account, validator.account);
  const bootstrap = (v.addrs as string[])[0];
  // a worker started before it holds anything: no stake, so no work
  const w = await start('worker', '--bootstrap', bootstrap, '--listen', '/ip4/127.0.0.1/tcp/0', '--data', workerDir, '--contracts', contracts, '--memory', '256MiB');
  const worker = cli('account', '--data', workerDir, '--contracts', contracts);
  assert.equal(worker.account, w.account);
  assert.deepEqual([worker.tokens, worker.stake], ['0', '0']);
  assert.equal(stakeOf(bootstrap, String(w.peerId)), '0');
  // funded while it runs: it stakes at its next announcement, and the validator sees it
  const funded = cli('fund', String(worker.account), '--amount', '1000', '--gas', '1', '--contracts', contracts);
  assert.deepEqual(funded.accounts, [worker.account]);
  await waitFor('the worker to stake', async () => stakeOf(bootstrap, String(w.peerId)) === String(100n * 10n ** 18n), 20_000);
  const held = cli('account', '--data', workerDir, '--contracts', contracts);
  assert.deepEqual([held.tokens, held.stake], ['900', '100']);
  // more stake by hand, from the same key
  assert.deepEqual(cli('stake', '--amount', '50', '--data', workerDir, '--contracts', contracts), { account: worker.account, staked: '50', stake: '150' });
  await waitFor('the validator to read the new stake', async () => stakeOf(bootstrap, String(w.peerId)) === String(150n * 10n ** 18n), 10_000);
  // what an operator gets wrong is one clear line, not a stack trace
  const broke = spawnSync(process.execPath, [BIN, 'stake', '--amount', '5', '--data', join(root, 'empty'), '--contracts', contracts], { encoding: 'utf8' });
  assert.notEqual(broke.status, 0);
  assert.match(broke.stderr, /holds 0 TLK, less than the 5 TLK to stake: send it tokens first \(tensorlink fund 0x/);
  assert.doesNotMatch(broke.stderr, /\n\s+at /);
  const badAddress = spawnSync(process.execPath, [BIN, 'fund', '0x1234', '--contracts', contracts], { encoding: 'utf8' });
  assert.notEqual(badAddress.status, 0);
  assert.match(badAddress.stderr, /'0x1234' is not an address/);
});
