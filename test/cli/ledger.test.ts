import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { generateKeyPair } from '@libp2p/crypto/keys';
import { peerIdFromPrivateKey } from '@libp2p/peer-id';
import { inclusionProof, makeBlock, signHeader } from '../../src/ledger/index.ts';
import { recordId, signRecord } from '../../src/verify/index.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

/** A libp2p Ed25519 identity as the records and headers sign with it: its peer id carries its public key. */
async function identity() {
  const key = await generateKeyPair('Ed25519');
  return { peer: peerIdFromPrivateKey(key).toString(), seed: key.raw.subarray(0, 32) };
}

describe('tensorlink ledger verify', () => {
  test('a proof holds offline; one byte of the record changed, or a signature short, exits 1 with the reason', async () => {
    const [worker, v1, v2] = await Promise.all([identity(), identity(), identity()]);
    const records = Array.from({ length: 6 }, (_, i) => signRecord({
      job: 'job-7', step: i, micro: 0, stage: [1, 2], kind: 'backward', input: 'a'.repeat(64), output: 'b'.repeat(64), weights: 'c'.repeat(64),
      backend: 'js', seq: i,
    }, worker));
    const block = makeBlock(null, records, Date.now());
    block.signatures = [signHeader(block.header, v1), signHeader(block.header, v2)];
    const proof = inclusionProof(block, recordId(records[4]));
    const dir = mkdtempSync(join(tmpdir(), 'tl-proof-'));
    const write = (name: string, p: unknown) => {
      writeFileSync(join(dir, name), JSON.stringify(p));
      return join(dir, name);
    };
    const run = (...args: string[]) => spawnSync(process.execPath, [BIN, 'ledger', 'verify', ...args], { encoding: 'utf8' });

    const ok = run(write('ok.json', proof), '--threshold', '2', '--validators', `${v1.peer},${v2.peer}`, '--json');
    assert.equal(ok.status, 0, ok.stderr);
    const expected = { valid: true, record: recordId(records[4]), height: 0, root: block.header.root, signatures: 2 };
    assert.deepEqual(JSON.parse(ok.stdout), expected);

    const altered = run(write('altered.json', { ...proof, record: { ...proof.record, output: 'd'.repeat(64) } }));
    assert.equal(altered.status, 1);
    assert.match(altered.stderr, /the proof does not hold: the record is not signed by its worker/);
    const short = run(write('short.json', proof), '--threshold', '3');
    assert.equal(short.status, 1);
    assert.match(short.stderr, /2 valid validator signatures; 3 are needed/);
    const outsider = run(join(dir, 'ok.json'), '--threshold', '2', '--validators', v1.peer);
    assert.match(outsider.stderr, /1 valid validator signatures; 2 are needed/);
    const missing = run(join(dir, 'nope.json'));
    assert.equal(missing.status, 1);
    assert.match(missing.stderr, /cannot read the proof/);
    assert.doesNotMatch(missing.stderr + altered.stderr, /\n\s+at /);
  });
});
