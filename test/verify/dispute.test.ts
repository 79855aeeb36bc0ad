import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { describe, test } from 'node:test';
import { createModel, gpt2Config, type ModelLayer } from '../../src/models/index.ts';
import { sectionCopy } from '../../src/pipeline/index.ts';
import { createOrtBackend, Generator, ortAvailable, randn, setBackend, type Tensor, tensor, withBackend } from '../../src/tensor/index.ts';
import { RedundantStage } from '../../src/user/redundant-stage.ts';
import type { JobVerifier } from '../../src/user/verifier.ts';
import { runDispute } from '../../src/validator/dispute.ts';
import { bisect, type Commit, type DisputeSide, leafOf, MerkleTree, type StepShape, verifyProof } from '../../src/verify/dispute.ts';
import { hashTensors, signRecord, type WorkRecord } from '../../src/verify/index.ts';
import { commitForward, type ForwardCommitment } from '../../src/worker/handlers/dispute.ts';

const config = gpt2Config({ vocabSize: 64, hidden: 32, layers: 2, heads: 4, maxPositions: 16 });
const range: [number, number] = [1, 2];

function keyPair() {
  const { privateKey } = generateKeyPairSync('ed25519');
  return new Uint8Array(privateKey.export({ format: 'der', type: 'pkcs8' }).subarray(16));
}

/** y + 1e-3·‖y‖/√n·N(0, 1), as the noise fault makes it. */
function noisy(y: Tensor): Tensor {
  const d = y.data as Float32Array;
  const sigma = (1e-3 * Math.sqrt(d.reduce((s, v) => s + v * v, 0))) / Math.sqrt(d.length);
  const g = new Generator(3);
  return tensor(d.map((v) => v + sigma * g.normal()), y.shape);
}

/** A side answering from a commitment, in memory (what the worker's dispute handlers answer over the network). */
function side(peer: string, record: WorkRecord, c: ForwardCommitment | null): DisputeSide {
  let bytes = 0;
  const silent = () => Promise.reject(new Error(`${peer} did not answer within 30000 ms`));
  return {
    peer,
    record,
    get bytes() {
      return bytes;
    },
    open: async (): Promise<Commit> => {
      if (!c) return silent();
      const input = { shape: [...c.values[0].shape], dtype: c.values[0].dtype };
      return { record, root: c.tree.root, size: c.tree.size, trace: c.trace, output: c.output, input };
    },
    leaves: async (slots) => {
      if (!c) return silent();
      bytes += slots.reduce((n, s) => n + 64 * (1 + c.tree.proof(s).length), 0);
      return slots.map((s) => ({ slot: s, value: c.hashes[s], proof: c.tree.proof(s) }));
    },
    value: async (s) => {
      if (!c) return silent();
      bytes += 4 * c.values[s].size;
      return c.values[s];
    },
    close: async () => {},
  };
}

describe('disputes by bisection: the pure parts', () => {
  test('a Merkle proof proves its leaf at its index, for every tree size, and nothing else', () => {
    for (let n = 1; n <= 9; n++) {
      const leaves = Array.from({ length: n }, (_, i) => leafOf(i, String(i)));
      const tree = new MerkleTree(leaves);
      for (let i = 0; i < n; i++) {
        assert.ok(verifyProof(tree.root, n, i, leaves[i], tree.proof(i)), `${i} of ${n}`);
        assert.ok(!verifyProof(tree.root, n, i, leafOf(i, 'other'), tree.proof(i)), `a changed leaf ${i} of ${n}`);
        if (n > 1) assert.ok(!verifyProof(tree.root, n, (i + 1) % n, leaves[i], tree.proof(i)), `leaf ${i} at another index of ${n}`);
      }
    }
  });

  test('bisection finds the op whose inputs agree and whose output differs, past a skip connection, in about log2(n) comparisons', async () => {
    // a chain of 64 ops, slot k + 1 written by op k from slot k; op 40 also reads slot 11 (a residual from op 10)
    const n = 64;
    const shape: StepShape = {
      slots: Array.from({ length: n + 1 }, (_, i) => ({ kind: i === 0 ? 'input' as const : 'result' as const, shape: [1], dtype: 'float32' })),
      ops: Array.from({ length: n }, (_, k) => ({ op: `op${k}`, inputSlots: k === 40 ? [k, 11] : [k], outputSlots: [k + 1] })),
    };
    for (const wrongFrom of [5, 37, 63]) {
      const cost = { compared: 0 };
      const found = await bisect(shape, n - 1, async (s) => s > wrongFrom, cost);
      assert.deepEqual(found, { kind: 'op', op: wrongFrom });
      assert.ok(cost.compared <= 2 * Math.log2(n) + 2, `${cost.compared} comparisons`);
    }
    // only slot 11 (op 10's result) and op 40's are wrong: op 40 differs, but so does its residual input: op 10 is the one
    assert.deepEqual(await bisect(shape, 40, async (s) => s === 11 || s === 41), { kind: 'op', op: 10 });
    // a step input that differs is named as a slot, not an op
    assert.deepEqual(await bisect(shape, n - 1, async () => true), { kind: 'slot', slot: 0 });
  });
});

describe('disputes by bisection: a tiny section settled in memory', () => {
  setBackend('js');
  // a section of a seeded model (createModel's own section is built empty, for weights to be loaded into)
  const model = sectionCopy(createModel(config, { seed: 5 }), range);
  const layers: readonly ModelLayer[] = model.layers;
  const x = randn([2, 6, 32], { generator: new Generator(1) });
  const seed = keyPair();
  const base = { job: 'j', step: 0, micro: 0, stage: range, seq: 0, input: hashTensors([x]), weights: 'c'.repeat(64) };
  const record = (peer: string, backend: string, output: Tensor) => signRecord({ ...base, kind: 'forward', backend, output: hashTensors([output]) }, { peer, seed });
  const honest = commitForward(layers, config.maxPositions, x);
  const y = honest.values[honest.output];
  const ops = () => withBackend('js', () => honest.tree.size);

  test('js against js, noise on the output it signed: the last op re-run alone shows it; one op of the step', async () => {
    ops();
    const cheat = noisy(y);
    // the cheater's own values are honest (it recomputes them), but it signed the noisy output
    const v = await runDispute(config, { a: side('A', record('A', 'js', y), honest), b: side('B', record('B', 'js', cheat), commitForward(layers, config.maxPositions, x)) });
    assert.deepEqual(v.losers, ['b'], v.reason);
    assert.equal(v.mode, 'exact');
    assert.equal(v.op?.index, v.cost.ops - 1, 'the last op');
    assert.equal(v.cost.opsRerun, 1);
    assert.ok(v.cost.compared < v.cost.ops, `${v.cost.compared} slots compared of a step of ${v.cost.ops} ops`);
  });

  test('js against js, a cheat inside the step (an op\'s output altered, the rest computed from it): bisection names that op', async () => {
    const at = 9;
    const bad = commitForward(layers, config.maxPositions, x, undefined, (i, outs) => {
      if (i === at) (outs[0].data as Float32Array)[0] += 0.5;
    });
    const v = await runDispute(config, { a: side('A', record('A', 'js', y), honest), b: side('B', record('B', 'js', bad.values[bad.output]), bad) });
    assert.deepEqual(v.losers, ['b'], v.reason);
    assert.equal(v.op?.index, at);
    assert.match(v.reason, new RegExp(`op ${at} '`));
    assert.equal(v.cost.opsRerun, 1);
  });

  test('a side that does not answer loses (both silent: inconclusive)', async () => {
    const v = await runDispute(config, { a: side('A', record('A', 'js', y), honest), b: side('B', record('B', 'js', noisy(y)), null) });
    assert.deepEqual(v.losers, ['b']);
    assert.match(v.reason, /did not commit/);
    assert.equal(v.cost.opsRerun, 0);
    // both silent: no evidence either way
    const none = await runDispute(config, { a: side('A', record('A', 'js', y), null), b: side('B', record('B', 'js', noisy(y)), null) });
    assert.deepEqual([none.losers, none.inconclusive], [[], true]);
  });

  test('ort against js, noise on the ort side\'s output: leaves compared within tolerance, the last op re-run from each side\'s inputs', { skip: !ortAvailable() }, async () => {
    const ort = createOrtBackend({ threads: 1 });
    const theirs = withBackend(ort, () => commitForward(layers, config.maxPositions, x));
    const returned = noisy(theirs.values[theirs.output]);
    const cheat = withBackend(ort, () => commitForward(layers, config.maxPositions, x, returned));
    const v = await runDispute(config, { a: side('A', record('A', 'js', y), honest), b: side('B', record('B', 'ort', returned), cheat) });
    assert.deepEqual(v.losers, ['b'], v.reason);
    assert.equal(v.mode, 'tolerance');
    assert.equal(v.op?.index, v.cost.ops - 1);
    assert.equal(v.cost.opsRerun, 2);
    // an honest ort side against a js cheater: the js side loses
    const jsCheat = noisy(y);
    const w = await runDispute(config, { a: side('A', record('A', 'js', jsCheat), honest), b: side('B', record('B', 'ort', theirs.values[theirs.output]), theirs) });
    assert.deepEqual(w.losers, ['a'], w.reason);
  });
});

describe('disputes by bisection: the trigger', () => {
  setBackend('js');
  const seed = keyPair();
  const y = randn([1, 2, 4], { generator: new Generator(4) });
  const fields = { job: 'j', step: 0, micro: 0, stage: range, seq: 0, input: 'a'.repeat(64), weights: 'c'.repeat(64), kind: 'forward' as const, backend: 'js' };
  const lane = (peer: string, value: Tensor) => ({
    peerId: peer, label: peer, worker: { peerId: peer, addrs: [] }, onRecord: null,
    forwardRecorded: async () => ({ value, record: signRecord({ ...fields, output: hashTensors([value]) }, { peer, seed }) }),
  });
  const verifier = (verdict: { losers: string[]; inconclusive?: boolean; reason: string }, audits: string[]) => ({
    summary: { compared: 0 }, excluded: new Set<string>(), observe: () => {}, forget: () => {},
    audit: async (w: { peerId: string }) => (audits.push(w.peerId), { ok: w.peerId === 'A', reason: w.peerId === 'A' ? 'reproduced' : 'not' }),
    dispute: async () => verdict,
  }) as unknown as JobVerifier;

  test('two forwards that disagree: a dispute settles them, the loser is flagged, the winner\'s result goes on; inconclusive falls back to re-execution', async () => {
    const flagged: string[] = [];
    const audits: string[] = [];
    const lanes = () => [lane('A', y), lane('B', noisy(y))] as unknown as ConstructorParameters<typeof RedundantStage>[0];
    const onFlag = async (l: { peerId: string }, reason: string) => void flagged.push(`${l.peerId}: ${reason}`);
    const settled = new RedundantStage(lanes(), verifier({ losers: ['B'], reason: 'op 37 \'add\'' }, audits), onFlag);
    assert.equal(await settled.forward(0, y), y);
    assert.deepEqual(flagged, ['B: forward of micro-batch 0: lost a dispute: op 37 \'add\'']);
    assert.deepEqual(audits, [], 'nothing re-executed');
    flagged.length = 0;
    const unsure = new RedundantStage(lanes(), verifier({ losers: [], inconclusive: true, reason: 'both match' }, audits), onFlag);
    assert.equal(await unsure.forward(0, y), y);
    assert.deepEqual(audits.sort(), ['A', 'B'], 're-executed as before');
    assert.equal(flagged.length, 1);
  });
});
