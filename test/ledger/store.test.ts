import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { appendFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { type Block, makeBlock, signHeader, type SignerSet } from '../../src/ledger/index.ts';
import { BLOCKS_FILE, LedgerStore } from '../../src/validator/ledger-store.ts';
import { signRecord } from '../../src/verify/index.ts';

function keyPair(peer: string) {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const seed = new Uint8Array(privateKey.export({ format: 'der', type: 'pkcs8' }).subarray(16));
  const raw = new Uint8Array(publicKey.export({ format: 'der', type: 'spki' }).subarray(12));
  return { signer: { peer, seed }, raw };
}

describe('ledger: a validator\'s block store', () => {
  const worker = keyPair('worker-1');
  const validators = [keyPair('validator-1'), keyPair('validator-2')];
  const keys = new Map([worker, ...validators].map((k) => [k.signer.peer, k.raw]));
  const signers: SignerSet = {
    keyOf: (p) => keys.get(p) ?? new Uint8Array(32), validators: new Set(validators.map((v) => v.signer.peer)), threshold: 2,
  };
  const record = (i: number) => signRecord({
    job: 'j', step: i, micro: 0, stage: [1, 2], kind: 'forward', input: 'a'.repeat(64), output: 'b'.repeat(64), weights: 'c'.repeat(64), backend: 'js', seq: i,
  }, worker.signer);
  const next = (store: LedgerStore, n: number, by = validators): Block => {
    const b = makeBlock(store.head, Array.from({ length: n }, (_, i) => record(store.height * 10 + i)), 1000 + store.height);
    b.signatures = by.map((v) => signHeader(b.header, v.signer));
    return b;
  };

  test('blocks survive a restart, a line cut short by a crash is dropped, a block short of signatures is refused', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tl-ledger-'));
    const store = new LedgerStore(dir, signers);
    for (const n of [3, 1, 4]) store.append(next(store, n));
    assert.throws(() => store.append(next(store, 2, validators.slice(0, 1))), /1 valid validator signatures; 2 are needed/);
    const again = new LedgerStore(dir, signers);
    assert.equal(again.height, 3);
    assert.deepEqual(again.head, store.head);
    assert.equal(again.at(1)!.records.length, 1);
    // a crash in the middle of an append: the torn line goes, the blocks before it stay
    const whole = JSON.stringify(next(again, 2));
    appendFileSync(join(dir, BLOCKS_FILE), whole.slice(0, whole.length / 2));
    const afterCrash = new LedgerStore(dir, signers);
    assert.equal(afterCrash.height, 3);
    afterCrash.append(next(afterCrash, 2));
    assert.equal(new LedgerStore(dir, signers).height, 4);
  });

  test('a block altered on disk is a typed error that names the line', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tl-ledger-'));
    const store = new LedgerStore(dir, signers);
    for (const n of [2, 2]) store.append(next(store, n));
    const file = join(dir, BLOCKS_FILE);
    const lines = readFileSync(file, 'utf8').split('\n');
    const b = JSON.parse(lines[0]);
    b.records[1].seq = 99;
    writeFileSync(file, [JSON.stringify(b), ...lines.slice(1)].join('\n'));
    assert.throws(() => new LedgerStore(dir, signers), { name: 'InvalidArgumentError', message: /line 1: block 0's root is not the root of its records/ });
    // re-signed by someone else: the root may match, the record's signature does not
    const forged = { ...signRecord({ ...b.records[1], seq: 1 }, validators[0].signer), peer: 'worker-1' };
    b.records[1] = forged;
    b.header = makeBlock(null, b.records, b.header.time).header;
    b.signatures = validators.map((v) => signHeader(b.header, v.signer));
    writeFileSync(file, [JSON.stringify(b), ...lines.slice(1)].join('\n'));
    assert.throws(() => new LedgerStore(dir, signers), { name: 'InvalidArgumentError', message: /line 1: block 0's record 1 is not signed by its worker worker-1/ });
  });
});
