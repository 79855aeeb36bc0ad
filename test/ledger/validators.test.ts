import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { multiaddr } from '@multiformats/multiaddr';
import { peerIdFromPrivateKey } from '@libp2p/peer-id';
import { createNode, loadOrCreateIdentity, request, signerOf, type TensorLinkNode } from '../../src/p2p/index.ts';
import { recordId, signRecord, type WorkRecord } from '../../src/verify/index.ts';
import { alive, type Running, startNode, waitFor } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

interface Show {
  height: number;
  records: number;
  pending: number;
  hash: string;
  block?: { signatures: string[]; records: { id: string }[] };
}

describe('ledger: two validators', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-validators-'));
  const procs: Running[] = [];
  let user: TensorLinkNode | null = null;
  let worker: TensorLinkNode | null = null;
  after(async () => {
    await user?.stop();
    await worker?.stop();
    for (const p of procs) if (alive(p.child)) p.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('blocks carry both signatures; a validator killed and restarted keeps every block and catches up; proofs check offline', async () => {
    // the validator set is configured: B's identity is made first, A accepts it by peer id, B dials A
    const idB = peerIdFromPrivateKey(await loadOrCreateIdentity(join(dir, 'b'))).toString();
    const a = await startNode(['validator', '--data', join(dir, 'a'), '--validators', idB]);
    procs.push(a);
    const startB = async () => {
      const b = await startNode(['validator', '--data', join(dir, 'b'), '--peers', a.addrs[0]]);
      procs.push(b);
      return b;
    };
    let b = await startB();
    user = await createNode();
    worker = await createNode();
    const signer = signerOf(worker);
    let seq = 0;
    const records = (n: number): WorkRecord[] => Array.from({ length: n }, () => signRecord({
      job: 'job-1', step: seq, micro: 0, stage: [1, 3], kind: 'forward', input: 'a'.repeat(64), output: 'b'.repeat(64), weights: 'c'.repeat(64),
      backend: 'js', flops: 1000, seq: seq++,
    }, signer));
    const show = async (v: Running, height?: number) =>
      (await request(user!, multiaddr(v.addrs[0]), { type: 'ledger-show', ...(height === undefined ? {} : { height }) })) as unknown as Show;
    const submit = (v: Running, rs: WorkRecord[]) => request(user!, multiaddr(v.addrs[0]), { type: 'ledger-submit', records: rs }, 60_000);

    // submitted to either validator, the records land in blocks on both, each block signed by both
    const first = records(40);
    const answers = await Promise.all([submit(a, first.slice(0, 20)), submit(b, first.slice(20))]);
    assert.deepEqual(answers.map((x) => x.accepted), [20, 20]);
    const { value: both } = await waitFor('both ledgers to hold 40 records', async () => {
      const [x, y] = await Promise.all([show(a), show(b)]);
      return x.records === 40 && y.records === 40 && x.hash === y.hash ? x : null;
    }, 20_000);
    for (let h = 0; h < both.height; h++) {
      const blk = (await show(b, h)).block!;
      assert.deepEqual([...blk.signatures].sort(), [a.peerId, b.peerId].sort(), `block ${h} is signed by both validators`);
    }
    // a peer outside the set is answered a hello (it may read the ledger) but may not propose, commit or have settlements signed
    const stranger = await request(user, multiaddr(a.addrs[0]), { type: 'ledger-hello', addrs: [] });
    assert.equal(stranger.type, 'ledger-head');
    const block0 = (await request(user, multiaddr(a.addrs[0]), { type: 'ledger-blocks', from: 0 })).blocks as unknown[];
    for (const type of ['ledger-propose', 'ledger-commit']) {
      await assert.rejects(request(user, multiaddr(a.addrs[0]), { type, block: block0[0] }), /UnauthorizedError|not a validator/);
    }

    // the same records again are duplicates, not new work
    const again = await submit(a, first.slice(0, 5));
    assert.equal(again.duplicate, 5);

    // B is killed; A goes on alone (threshold 1); B restarted from its data keeps its blocks and catches up
    b.child.kill('SIGKILL');
    await new Promise((r) => b.child.once('exit', r));
    const second = records(30);
    await submit(a, second);
    const heightA = (await show(a)).height;
    assert.ok(heightA > both.height);
    b = await startB();
    const { value: caught } = await waitFor('the restarted validator to catch up', async () => {
      const y = await show(b);
      return y.height === heightA ? y : null;
    }, 20_000);
    assert.equal(caught.records, 70);
    assert.equal(caught.hash, (await show(a)).hash);

    // a proof from the restarted validator checks offline, with both validators named
    const id = recordId(first[3]);
    const proof = await request(user, multiaddr(b.addrs[0]), { type: 'ledger-proof', record: id });
    const file = join(dir, 'proof.json');
    writeFileSync(file, JSON.stringify(proof.proof));
    const ok = spawnSync(process.execPath, [BIN, 'ledger', 'verify', file, '--threshold', '2', '--validators', `${a.peerId},${b.peerId}`], { encoding: 'utf8' });
    assert.equal(ok.status, 0, ok.stderr);
    // a record nobody submitted has no proof
    await assert.rejects(request(user, multiaddr(a.addrs[0]), { type: 'ledger-proof', record: 'f'.repeat(64) }), /is in no block/);
  });
});
