// The validator's check of activation commitments (src/verify/commitment.ts): one prefill over a session's inputs
// gives what a worker decoding step by step committed to (bitwise on js: every chunk passes with 0 difference); a
// check made as the session goes (the prefill so far kept) agrees with one made at the end; a worker that computed
// with other weights, or a session whose past was swapped, fails.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createModel, defaultPositions, KVCache, llamaConfig } from '../../src/models/index.ts';
import { sectionCopy } from '../../src/pipeline/index.ts';
import { noGrad, randn, setBackend, type Tensor } from '../../src/tensor/index.ts';
import {
  auxHash, checkCommitments, ChunkCommitter, hashTensors, sessionStepHash, type SessionStep, type WorkRecord,
} from '../../src/verify/index.ts';

setBackend('js');
const config = llamaConfig({ vocabSize: 64, hidden: 32, layers: 2, heads: 4, kvHeads: 2, intermediate: 64, maxPositions: 128 });
const ROWS = 2;

/** A worker's session: a prefill of 20 positions, then one position a step up to 70; its records with their commitments. */
function session(seed: number) {
  const section = sectionCopy(createModel(config, { seed }), [1, 3]);
  const steps: SessionStep[] = [];
  let at = 0;
  for (const t of [20, ...Array.from({ length: 50 }, () => 1)]) {
    steps.push({ input: randn([ROWS, t, config.hidden], { seed: 100 + at }), positions: defaultPositions(ROWS, t, at), keyMask: null });
    at += t;
  }
  const cache = new KVCache(config.layers);
  const committer = new ChunkCommitter(ROWS, config.hidden);
  let position = 0;
  const records = steps.map((s, i): WorkRecord => {
    const y = noGrad(() => section.forward(s.input, { cache, positions: s.positions, keyMask: null }));
    const x = s.input.data as Float32Array;
    const proofs = committer.push((y.data as Float32Array).map((v, k) => v - x[k]), position, s.input.shape[1]);
    const record = {
      job: 'j', step: position, micro: 0, stage: [1, 3] as [number, number], kind: 'decode' as const, session: 's', input: hashTensors([s.input]),
      aux: auxHash(s.positions, null), output: hashTensors([y]), weights: 'w', backend: 'js', peer: 'p', seq: i, sig: '',
      ...(proofs.length > 0 ? { commits: Buffer.concat(proofs).toString('base64') } : {}),
    };
    position += s.input.shape[1];
    return record;
  });
  const sent = steps.map((s) => sessionStepHash(hashTensors([s.input]), auxHash(s.positions, null)));
  return { section, steps, records, sent };
}

const closing = (records: WorkRecord[]) => records.filter((r) => r.commits !== undefined);

test('one prefill checks every chunk a worker committed to while decoding step by step (js: no difference at all)', () => {
  const { section, steps, records, sent } = session(1);
  const checks = closing(records);
  assert.deepEqual(checks.map((r) => r.step), [31, 63], 'chunks 0 and 1 close at positions 31 and 63');
  const last = records.at(-1)!;
  const v = checkCommitments(section, { last, checks, chunks: [0, 1], history: steps, sent }, 'f32');
  assert.equal(v.ok, true, v.reason);
  assert.equal(v.chunks, 2 * ROWS);
  assert.deepEqual(v.worst, { expMismatches: 0, mantMean: 0, mantMedian: 0 });
});

test('checked as the session goes (the prefill kept between checks): the same verdicts as one check at the end', () => {
  const { section, steps, records, sent } = session(1);
  const [c0, c1] = closing(records);
  const upTo = (r: WorkRecord) => records.indexOf(r) + 1;
  const first = checkCommitments(section, { last: c0, checks: [c0], chunks: [0], history: steps.slice(0, upTo(c0)), sent: sent.slice(0, upTo(c0)) }, 'f32');
  assert.equal(first.ok, true, first.reason);
  assert.equal(first.prefill!.position, 32);
  const second = checkCommitments(
    section, { last: c1, checks: [c1], chunks: [1], history: steps.slice(upTo(c0), upTo(c1)), sent: sent.slice(0, upTo(c1)) }, 'f32', first.prefill,
  );
  assert.equal(second.ok, true, second.reason);
  assert.deepEqual(second.worst, { expMismatches: 0, mantMean: 0, mantMedian: 0 });
  assert.equal(second.prefill!.position, 64);
  // a user that says the session was sent something else before is not believed
  const swapped = [...sent.slice(0, upTo(c1))];
  swapped[3] = swapped[4];
  const bad = checkCommitments(section, { last: c1, checks: [c1], chunks: [1], history: steps.slice(upTo(c0), upTo(c1)), sent: swapped }, 'f32', first.prefill);
  assert.equal(bad.ok, false);
});

test('a worker that computed with another model\'s weights fails at its first chunk; inputs that are not the session\'s fail', () => {
  const honest = session(1);
  const cheat = session(2); // the same inputs through another seed's weights
  const checks = closing(cheat.records);
  const v = checkCommitments(honest.section, { last: cheat.records.at(-1)!, checks, chunks: [0, 1], history: honest.steps, sent: honest.sent }, 'f32');
  assert.equal(v.ok, false);
  assert.match(v.reason, /^chunk 0 \(positions 0-31\), row 0: \d+ of 128 values differ in sign or exponent/);
  const other: Tensor = randn([ROWS, 1, config.hidden], { seed: 7 });
  const steps = [...honest.steps];
  steps[5] = { ...steps[5], input: other };
  const w = checkCommitments(honest.section, { last: honest.records.at(-1)!, checks: closing(honest.records), chunks: [0], history: steps, sent: honest.sent }, 'f32');
  assert.deepEqual([w.ok, w.reason], [false, 'the inputs it kept are not the ones its session was sent']);
});
