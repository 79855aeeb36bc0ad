import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { describe, test } from 'node:test';
import { configToHF, createModel, gpt2Config } from '../../src/models/index.ts';
import { sectionWeights, StageExecutor } from '../../src/pipeline/index.ts';
import { Generator, randn, setBackend, type Tensor } from '../../src/tensor/index.ts';
import {
  AuditSampler, checkRecord, expectedStepsToCatch, gradsHash, hashArrays, hashTensors, optimizerHash, parseRecord, recordId, reexecute,
  Reputation, recordFlops, sectionCost, signRecord, STEP_FLOPS_PER_PARAM, stepCatchProbability, stepsToCatch, type WorkRecord, weightsHash,
} from '../../src/verify/index.ts';

/** A fresh Ed25519 key as raw bytes: the 32-byte seed that signs, the 32-byte public key that checks. */
function keyPair() {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const seed = new Uint8Array(privateKey.export({ format: 'der', type: 'pkcs8' }).subarray(16));
  const raw = new Uint8Array(publicKey.export({ format: 'der', type: 'spki' }).subarray(12));
  return { seed, raw };
}

const H = 'a'.repeat(64);
const fields = { job: 'job-1', step: 3, micro: 1, stage: [1, 3] as [number, number], kind: 'forward' as const, input: H, output: 'b'.repeat(64), weights: 'c'.repeat(64), backend: 'js', seq: 7 };

describe('records: signed, parsed, checked on arrival', () => {
  const { seed, raw } = keyPair();
  const signer = { peer: 'peer-A', seed };
  const expect = { job: 'job-1', peer: 'peer-A', kind: 'forward' as const, step: 3, micro: 1, input: H, output: 'b'.repeat(64) };

  test('a record signed by its worker passes; one byte changed anywhere fails', () => {
    const r = signRecord(fields, signer);
    checkRecord(r, raw, expect);
    const parsed = parseRecord(JSON.parse(JSON.stringify(r)));
    checkRecord(parsed, raw, expect);
    assert.equal(recordId(parsed), recordId(r));
    for (const tampered of [{ ...r, output: 'd'.repeat(64) }, { ...r, seq: 8 }, { ...r, step: 4 }, { ...r, sig: r.sig.replace(/^./, r.sig[0] === 'A' ? 'B' : 'A') }]) {
      assert.throws(() => checkRecord(tampered as WorkRecord, raw, { ...expect, output: tampered.output, step: tampered.step }), { name: 'VerificationError' });
    }
  });

  test('the chain: a record naming another input, output or weights than the receiver knows is refused', () => {
    const r = signRecord(fields, signer);
    assert.throws(() => checkRecord(r, raw, { ...expect, input: 'e'.repeat(64) }), /input other than/);
    assert.throws(() => checkRecord(r, raw, { ...expect, output: 'e'.repeat(64) }), /output other than/);
    assert.throws(() => checkRecord(r, raw, { ...expect, weights: 'e'.repeat(64) }), /weights other than/);
    assert.throws(() => checkRecord(r, keyPair().raw, expect), /signature/);
    assert.throws(() => checkRecord(r, raw, { ...expect, peer: 'peer-B' }), /signed as peer-A/);
  });

  test('malformed records from a peer are typed errors', () => {
    for (const bad of [null, 5, [], { ...fields, kind: 'dance', sig: 'x' }, { ...fields, input: 'zz', sig: 'x' }, { ...fields, step: -1, sig: 'x' }, { ...fields, stage: [1], sig: 'x' }]) {
      assert.throws(() => parseRecord(bad), { name: 'InvalidMessageError' });
    }
  });
});

describe('re-execution of a record, bit for bit on js', () => {
  setBackend('js');
  const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, maxPositions: 32 });
  const model = createModel(config, { seed: 5 });
  const range: [number, number] = [1, 3];
  const weights = () => new Map([...sectionWeights(model, range)].map(([n, t]) => [n, t.clone()]));
  const worker = () => {
    const part = createModel(config, { section: range });
    part.loadStateDict(weights());
    let contribution = new Map<string, Tensor>();
    const onContribution = (_m: number, c: Map<string, Tensor>) => (contribution = new Map(c));
    const ex: StageExecutor = new StageExecutor(part.layers, config.maxPositions, { lr: 1e-2, onContribution });
    return { ex, contribution: () => contribution };
  };
  const x = randn([2, 5, 32], { generator: new Generator(1) });
  const g = randn([2, 5, 32], { generator: new Generator(2) });
  const { seed } = keyPair();
  const signer = { peer: 'w', seed };
  const base = { job: 'j', step: 0, micro: 0, stage: range, backend: 'js', seq: 0 };
  const bundle = { config: configToHF(config), range, optimizer: { lr: 1e-2 } };

  test('forward and backward records reproduce; a noisy output, a scaled gradient or other weights do not', () => {
    const { ex, contribution } = worker();
    const w = weightsHash(ex);
    const y = ex.forward(0, x);
    const forward = signRecord({ ...base, kind: 'forward', input: hashTensors([x]), output: hashTensors([y]), weights: w }, signer);
    assert.equal(reexecute(forward, { ...bundle, weights: weights(), input: x }).ok, true);
    const noisy = y.clone();
    (noisy.data as Float32Array)[0] += 1e-6;
    assert.equal(reexecute({ ...forward, output: hashTensors([noisy]) }, { ...bundle, weights: weights(), input: x }).ok, false);
    const other = weights();
    (other.values().next().value!.data as Float32Array)[0] += 1;
    assert.match(reexecute(forward, { ...bundle, weights: other, input: x }).reason, /weights it kept/);
    const gi = ex.backward(0, g)!;
    const backward = signRecord({ ...base, kind: 'backward', input: hashTensors([g]), output: hashTensors([gi]), grads: gradsHash(ex, contribution()), weights: w }, signer);
    assert.equal(reexecute(backward, { ...bundle, weights: weights(), input: x, grad: g }).ok, true);
    const doubled = new Map([...contribution()].map(([n, t]) => [n, t.mul(2)]));
    const scaled = reexecute({ ...backward, grads: gradsHash(ex, doubled) }, { ...bundle, weights: weights(), input: x, grad: g });
    assert.match(scaled.reason, /gradients/);
  });

  test('the FLOPs a record states are checked: the section profile times the tokens kept; an inflated figure fails', () => {
    const { ex } = worker();
    const y = ex.forward(0, x);
    const cost = sectionCost(config, range);
    assert.ok(cost.flopsPerToken > 0 && cost.params > 0);
    const flops = recordFlops('forward', cost, 2 * 5);
    assert.equal(recordFlops('backward', cost, 10), 2 * flops);
    assert.equal(recordFlops('step', cost, 0), STEP_FLOPS_PER_PARAM * cost.params);
    const fields = { ...base, kind: 'forward' as const, input: hashTensors([x]), output: hashTensors([y]), weights: weightsHash(ex) };
    assert.equal(reexecute(signRecord({ ...fields, flops }, signer), { ...bundle, weights: weights(), input: x }).ok, true);
    const inflated = reexecute(signRecord({ ...fields, flops: 10 * flops }, signer), { ...bundle, weights: weights(), input: x });
    assert.equal(inflated.ok, false);
    assert.match(inflated.reason, /FLOPs/);
  });

  test('a step record reproduces from the state it started from; a skipped step does not', () => {
    const { ex } = worker();
    ex.forward(0, x);
    ex.backward(0, g);
    const grads = new Map([...ex.named].map(([n, p]) => [n, p.grad!.clone()]));
    const before = { weights: weights(), state: optimizerHash(ex), w: weightsHash(ex) };
    ex.step(0.5, 1e-2);
    const record = signRecord({
      ...base, kind: 'step', input: gradsHash(ex, grads), output: weightsHash(ex), weights: before.w, state: before.state, after: optimizerHash(ex), scale: 0.5, lr: 1e-2,
    }, signer);
    // the state hash reads the moments where they are held: the hash of the [2, ...shape] copies `moments` gives
    const copies = [...ex.named.keys()].map((n) => {
      const m = ex.moments(n);
      return [n, m ? (m.moments.data as Float32Array) : null, m?.step ?? -1] as const;
    });
    assert.equal(record.after, hashArrays(copies));
    const stepBundle = { ...bundle, weights: before.weights, grads, moments: new Map() };
    assert.equal(reexecute(record, stepBundle).ok, true);
    assert.match(reexecute({ ...record, output: before.w }, stepBundle).reason, /weights after its step/);
  });
});

describe('sampling arithmetic and reputation', () => {
  test('detection by sampled re-execution follows the geometric law p predicts (2,000 seeded trials)', () => {
    const rate = 0.05;
    const perStep = 9;
    const q = stepCatchProbability(rate, perStep);
    assert.ok(Math.abs(q - (1 - 0.95 ** 9)) < 1e-12);
    const caught: number[] = [];
    for (let trial = 0; trial < 2000; trial++) {
      const sampler = new AuditSampler(rate, 1000 + trial);
      let step = 1;
      for (;;) {
        let hit = false;
        for (let r = 0; r < perStep; r++) hit = sampler.pick() || hit;
        if (hit) break;
        step++;
      }
      caught.push(step);
    }
    const mean = caught.reduce((a, b) => a + b, 0) / caught.length;
    // mean 1/q ≈ 2.70; the standard error of 2,000 trials is √(1−q)/q/√2000 ≈ 0.05
    assert.ok(Math.abs(mean - expectedStepsToCatch(rate, perStep)) < 0.2, `mean ${mean} vs ${expectedStepsToCatch(rate, perStep)}`);
    for (const s of [1, 2, 3, 5]) {
      const share = caught.filter((c) => c <= s).length / caught.length;
      assert.ok(Math.abs(share - (1 - (1 - q) ** s)) < 0.04, `P(caught ≤ ${s}) = ${share}`);
    }
    const bound = stepsToCatch(rate, perStep, 0.99);
    assert.equal(bound, 10);
    assert.ok(caught.filter((c) => c > bound).length / caught.length < 0.02);
  });

  test('reputation: an exponential moving average of checks; one failure flags and excludes', () => {
    const rep = new Reputation(0.5, 0.5);
    assert.equal(rep.check('a', true).score, 0.75);
    assert.equal(rep.check('a', true).score, 0.875);
    assert.equal(rep.excluded('a'), false);
    const s = rep.check('b', false, 'noise');
    assert.equal(s.score, 0.25);
    assert.equal(s.excluded, true);
    assert.equal(s.reason, 'noise');
    assert.deepEqual([...rep.all().keys()], ['a', 'b']);
  });
});
