import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { describe, test } from 'node:test';
import {
  acceptRecord, blockProblem, entryKey, epochRewards, inclusionProblem, inclusionProof, leafHash, makeBlock, MerkleTree, nodeHash,
  parseLedgerRecord, rootFromProof, signHeader, type SignerSet, verifyProof,
} from '../../src/ledger/index.ts';
import { Generator } from '../../src/tensor/index.ts';
import { recordId, signRecord, type WorkRecord } from '../../src/verify/index.ts';

/** A fresh Ed25519 key: the 32-byte seed that signs, the raw public key that checks. */
function keyPair(peer: string) {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const seed = new Uint8Array(privateKey.export({ format: 'der', type: 'pkcs8' }).subarray(16));
  const raw = new Uint8Array(publicKey.export({ format: 'der', type: 'spki' }).subarray(12));
  return { signer: { peer, seed }, raw };
}

const H = (c: string) => c.repeat(64);

describe('ledger: Merkle trees', () => {
  test('every leaf of trees of 1 to 33 leaves proves into the root; any other leaf, index or sibling does not', () => {
    for (let n = 1; n <= 33; n++) {
      const leaves = Array.from({ length: n }, (_, i) => leafHash(`record ${i}`));
      const tree = new MerkleTree(leaves);
      for (let i = 0; i < n; i++) {
        const p = tree.proof(i);
        assert.ok(p.siblings.length <= Math.ceil(Math.log2(n)), `n ${n}: ${p.siblings.length} siblings`);
        assert.ok(verifyProof(leaves[i], p, tree.root), `n ${n} leaf ${i}`);
        assert.ok(!verifyProof(leafHash(`other ${i}`), p, tree.root));
        if (n > 1) assert.ok(!verifyProof(leaves[i], { ...p, index: (i + 1) % n }, tree.root) || leaves[i] === leaves[(i + 1) % n]);
        if (p.siblings.length > 0) {
          const bad = [...p.siblings];
          bad[0] = bad[0].replace(/^./, bad[0][0] === '0' ? '1' : '0');
          assert.ok(!verifyProof(leaves[i], { ...p, siblings: bad }, tree.root));
          assert.equal(rootFromProof(leaves[i], { ...p, siblings: [...p.siblings, p.siblings[0]] }), null, 'a sibling too many');
        }
      }
    }
  });

  test('an inner node cannot pass for a leaf, and lists that differ have different roots', () => {
    const leaves = ['a', 'b', 'c', 'd'].map((s) => leafHash(s));
    const tree = new MerkleTree(leaves);
    const inner = nodeHash(leaves[0], leaves[1]);
    // a leaf made of two children's bytes does not hash to their parent (0x00 and 0x01 prefixes)
    assert.notEqual(leafHash(Buffer.from(leaves[0] + leaves[1], 'hex')), inner);
    assert.notEqual(new MerkleTree(leaves.slice(0, 3)).root, new MerkleTree([...leaves.slice(0, 3), leaves[2]]).root);
    assert.equal(rootFromProof(leaves[0], { index: 5, size: 4, siblings: [] }), null);
    assert.throws(() => tree.proof(4), { name: 'InvalidMessageError' });
  });
});

describe('ledger: blocks and inclusion proofs', () => {
  const worker = keyPair('worker-1');
  const user = keyPair('user-1');
  const validators = [keyPair('validator-1'), keyPair('validator-2'), keyPair('validator-3')];
  const keys = new Map([worker, user, ...validators].map((k) => [k.signer.peer, k.raw]));
  const signers: SignerSet = {
    keyOf: (peer) => {
      const k = keys.get(peer);
      if (!k) throw new Error(`unknown ${peer}`);
      return k;
    },
    validators: new Set(validators.map((v) => v.signer.peer)),
    threshold: 2,
  };
  const records: WorkRecord[] = Array.from({ length: 5 }, (_, i) => signRecord({
    job: 'job-1', step: i, micro: 0, stage: [1, 2], kind: 'forward', input: H('a'), output: H('b'), weights: H('c'), backend: 'js', seq: i,
  }, worker.signer));

  function signed(prev: Parameters<typeof makeBlock>[0], rs: WorkRecord[], by = validators.slice(0, 2)) {
    const b = makeBlock(prev, rs, 1000);
    b.signatures = by.map((v) => signHeader(b.header, v.signer));
    return b;
  }

  test('a chain of blocks co-signed by 2 of 3 validators is valid; one signature short, another root or a broken link is not', () => {
    const b0 = signed(null, records.slice(0, 3));
    const b1 = signed(b0.header, records.slice(3));
    assert.equal(blockProblem(b0, null, signers), null);
    assert.equal(blockProblem(b1, b0.header, signers), null);
    assert.match(blockProblem(signed(null, records, validators.slice(0, 1)), null, signers)!, /1 valid validator signatures; 2 are needed/);
    // the same validator twice counts once; a worker's signature does not count
    const twice = makeBlock(null, records, 1);
    const by = (k: { signer: { peer: string; seed: Uint8Array } }) => signHeader(twice.header, k.signer);
    twice.signatures = [by(validators[0]), by(validators[0]), by(worker)];
    assert.match(blockProblem(twice, null, signers)!, /1 valid/);
    assert.match(blockProblem({ ...b1, records: records.slice(2) }, b0.header, signers)!, /root/);
    assert.match(blockProblem(b1, null, signers)!, /height 1 does not follow nothing/);
    assert.equal(blockProblem(signed(null, records.slice(3)), null, signers), null);
    const forked = signed({ ...b0.header, time: 2 }, records.slice(3));
    assert.match(blockProblem(forked, b0.header, signers)!, /does not name the previous header/);
  });

  test('an inclusion proof checks offline; a record altered in one byte, or a header short of signatures, fails', () => {
    const block = signed(null, records);
    const p = inclusionProof(block, recordId(records[3]));
    const file = JSON.parse(JSON.stringify(p));
    assert.equal(inclusionProblem(file, signers), null);
    assert.match(inclusionProblem({ ...file, record: { ...file.record, seq: 4 } }, signers)!, /not signed by its worker/);
    const resigned = signRecord({ ...records[3], output: H('d') }, worker.signer);
    assert.match(inclusionProblem({ ...file, record: resigned }, signers)!, /does not lead/);
    const one = { ...file, signatures: file.signatures.slice(0, 1) };
    assert.match(inclusionProblem(one, signers)!, /1 valid validator signatures; 2 are needed/);
    assert.match(inclusionProblem({ ...file, header: { ...file.header, time: 5 } }, signers)!, /0 valid/);
    // a proof must be of a tree of the block's size: an inner node cannot be passed off as a leaf of a smaller tree
    assert.match(inclusionProblem({ ...file, proof: { ...file.proof, size: 3 } }, signers)!, /size/);
    assert.throws(() => inclusionProof(block, H('e')), { name: 'InvalidMessageError' });
  });

  test('a record a user accepted: the block and its proofs commit to who accepted it; a forged or altered acceptance fails', () => {
    const accepted = records.map((r) => acceptRecord(r, user.signer));
    assert.equal(recordId(accepted[0]), recordId(records[0]), 'the record keeps its id');
    assert.notEqual(entryKey(accepted[0]), entryKey(records[0]), 'an accepted record is another ledger entry than the bare one');
    const block = signed(null, [...accepted.slice(0, 3), records[3]]);
    assert.equal(blockProblem(block, null, signers), null);
    // the header commits to the acceptance: the same records without it (or with another user's) have another root
    assert.notEqual(block.header.root, makeBlock(null, [...records.slice(0, 4)], 1000).header.root);
    const forged = { ...accepted[1], by: { user: user.signer.peer, sig: acceptRecord(records[1], worker.signer).by!.sig } };
    assert.match(blockProblem(signed(null, [accepted[0], forged]), null, signers)!, /not signed by the user user-1/);
    const file = JSON.parse(JSON.stringify(inclusionProof(block, recordId(records[1]))));
    assert.deepEqual(parseLedgerRecord(file.record), accepted[1]);
    assert.equal(inclusionProblem(file, signers), null);
    assert.match(inclusionProblem({ ...file, record: records[1] }, signers)!, /does not lead/);
    assert.match(inclusionProblem({ ...file, record: { ...file.record, by: { ...file.record.by, user: 'worker-1' } } }, signers)!, /acceptance is not signed/);
    assert.throws(() => parseLedgerRecord({ ...file.record, by: 'user-1' }), { name: 'InvalidMessageError' });
  });
});

describe('ledger: the reward formula', () => {
  test('workers share by work × reputation, validators by blocks signed; amounts sum to the pool less the carry', () => {
    const { rewards, carry } = epochRewards(1_000_000n, 1000, [
      { account: '0xa', work: 3e12, reputation: 1 },
      { account: '0xb', work: 1e12, reputation: 0.5 },
      { account: '0xc', work: 5e12, reputation: 0 },
    ], [{ account: '0xv1', blocks: 3 }, { account: '0xv2', blocks: 1 }]);
    // workers: 900,000 split 3 : 0.5
    assert.equal(rewards.get('0xa'), (900_000n * 3n * 2n) / 7n);
    assert.equal(rewards.get('0xb'), (900_000n * 1n) / 7n);
    assert.equal(rewards.get('0xc'), undefined, 'a flagged worker earns nothing');
    assert.equal(rewards.get('0xv1'), 75_000n);
    assert.equal(rewards.get('0xv2'), 25_000n);
    assert.equal([...rewards.values()].reduce((a, b) => a + b, 0n) + carry, 1_000_000n);
    assert.ok(carry >= 0n && carry < 4n);
  });

  test('random epochs never pay more than the pool', () => {
    const rng = new Generator(5);
    for (let t = 0; t < 200; t++) {
      const pool = BigInt(Math.floor(rng.uniform() * 1e12));
      const workers = Array.from({ length: 1 + Math.floor(rng.uniform() * 6) }, (_, i) => ({ account: `w${i}`, work: Math.floor(rng.uniform() * 1e15), reputation: rng.uniform() }));
      const { rewards, carry } = epochRewards(pool, Math.floor(rng.uniform() * 10_001), workers, [{ account: 'v', blocks: Math.floor(rng.uniform() * 3) }]);
      const paid = [...rewards.values()].reduce((a, b) => a + b, 0n);
      assert.equal(paid + carry, pool);
      assert.ok(carry >= 0n && [...rewards.values()].every((r) => r > 0n));
    }
    assert.throws(() => epochRewards(1n, 10_001, [], []), { name: 'InvalidArgumentError' });
    assert.throws(() => epochRewards(1n, 0, [{ account: 'x', work: 1, reputation: 2 }], []), { name: 'InvalidArgumentError' });
  });
});
