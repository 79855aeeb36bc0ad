import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { fortunesDataset, type TextCodec, textBatch } from '../../src/data/index.ts';
import { createModel, gpt2Config, trainingOptimizer } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { Generator, setBackend, tensor } from '../../src/tensor/index.ts';
import { distribute } from '../../src/user/index.ts';
import { adamStepBound, type RoundReport, SCORE_FLOOR } from '../../src/user/scoring.ts';
import { startValidator } from '../../src/validator/index.ts';
import { Reputation } from '../../src/verify/index.ts';
import { parseTrialForward } from '../../src/worker/handlers/trial.ts';
import { type FaultKind, startWorker, type Worker } from '../../src/worker/index.ts';

const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 4, heads: 4, maxPositions: 33 });
const SEQ = 32;
const STEPS = 8;
const SYNC = 4;
const bytes: TextCodec = { encode: (text) => Array.from(Buffer.from(text, 'utf8')) };
const data = fortunesDataset(bytes);

interface Run {
  losses: number[];
  rounds: RoundReport[];
  flagged: string[];
  cheater: string | null;
  replayed: number;
}

/**
 * 2 sections × 2 replicas on four workers (one of them cheating with `fault`), local steps averaged every
 * SYNC steps and scored before each average; a fifth honest worker joins after the job is placed, so the
 * cheater holds a section and an honest worker can take its place.
 */
async function run(fault: FaultKind | null): Promise<Run> {
  const validator = await startValidator();
  const boot = validator.node.getMultiaddrs()[0].toString();
  const workers: Worker[] = [];
  const user = await createNode();
  try {
    for (let i = 0; i < 4; i++) {
      workers.push(await startWorker({ bootstrap: boot, ...(fault && i === 1 ? { fault: { kind: fault, rate: 1 } } : {}) }));
    }
    const cheater = fault ? workers[1].node.peerId.toString() : null;
    const dm = await distribute(user, boot, createModel(config, { seed: 5 }), {
      strategy: 'parameter-balanced', replicas: 2, training: true, verify: { sampleRate: 0 },
    });
    assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 4);
    workers.push(await startWorker({ bootstrap: boot }));
    const rounds: RoundReport[] = [];
    const trainer = await dm.trainer({
      optimizer: { lr: 3e-3 }, totalSteps: STEPS, warmupSteps: 2, microBatches: 2, replicas: 2, syncEvery: SYNC, snapshotEvery: 0,
      // each round's held-out windows: from the quotes no step trains on, drawn with a seed of the user's
      score: { batch: (step) => textBatch(data.heldOut, new Generator(1000 + step), 4, SEQ), onRound: (r) => rounds.push(r) },
    });
    const rng = new Generator(11);
    const losses: number[] = [];
    let last = null;
    for (let s = 0; s < STEPS; s++) {
      last = await trainer.step(textBatch(data.train, rng, 4, SEQ));
      losses.push(last.loss);
    }
    await dm.close();
    return { losses, rounds, flagged: last!.verification.flagged, cheater, replayed: last!.verification.replayedSteps };
  } finally {
    await user.stop();
    await Promise.all(workers.map((w) => w.stop()));
    await validator.stop();
  }
}

function describeRounds(name: string, r: Run): string {
  const one = (p: RoundReport['replicas'][number]) => `s${p.section}r${p.replica}${p.peer === r.cheater ? '*' : ''} score ${p.score.toFixed(3)} `
    + `(impr ${p.improvement.toExponential(2)}, cos ${p.agreement.toFixed(3)}) ‖Δ‖ ratio ${p.normRatio?.toFixed(3) ?? '-'}, max|Δ| over the AdamW bound ${p.stepRatio.toFixed(3)} → ${p.value.toFixed(2)}`;
  return r.rounds.map((x) => `${name}, average after step ${x.step}: ${x.replicas.map(one).join('; ')}`).join('\n');
}

describe('soft scores and the trial forward\'s message', () => {
  test('Reputation.score: one round below the floor never excludes, two net of good rounds do; check() still excludes on one failure', () => {
    const r = new Reputation();
    assert.equal(r.score('a', -3, { floor: 0 }).excluded, false);
    assert.equal(r.score('a', 1.2, { floor: 0 }).rounds!.below, 0, 'a good round forgives one');
    assert.equal(r.score('a', -3, { floor: 0 }).excluded, false);
    const out = r.score('a', -1, { floor: 0 }, 'scaled');
    assert.deepEqual([out.excluded, out.reason, out.rounds!.count, out.rounds!.below], [true, 'scaled', 4, 2]);
    assert.ok(out.score < 0.5);
    assert.equal(r.score('b', -3, { floor: 0, rounds: 1 }).excluded, true);
    assert.throws(() => r.score('c', Number.NaN, { floor: 0 }), { name: 'InvalidArgumentError' });
    assert.equal(r.check('d', false, 'bad').excluded, true);
  });

  test('AdamW never moves a weight further than lr·adamStepBound(t) a step, whatever its gradients (steady, noisy, spiking after quiet)', () => {
    assert.ok(Math.abs(adamStepBound(1) - 1) < 1e-12);
    const rng = new Generator(3);
    const n = 64;
    const p = tensor(new Float32Array(n), [n]);
    p.requiresGrad = true;
    const opt = trainingOptimizer([p], { lr: 1e-2 });
    let worst = 0;
    for (let t = 1; t <= 300; t++) {
      // coordinate i: constant sign, noise, or 1e-4 for a long time and then a spike of 1e4 at step 100 + i
      const g = Float32Array.from({ length: n }, (_, i) => (i % 3 === 0 ? 1 : i % 3 === 1 ? rng.normal() : t === 100 + i ? 1e4 : 1e-4));
      p.grad = tensor(g, [n]);
      const before = (p.data as Float32Array).slice();
      opt.step();
      const moved = Math.max(...(p.data as Float32Array).map((w, i) => Math.abs(w - before[i])));
      worst = Math.max(worst, moved / (1e-2 * adamStepBound(t)));
    }
    console.log(`AdamW's largest step over lr·bound in 300 steps: ${worst.toFixed(4)}`);
    assert.ok(worst <= 1 + 1e-5 && worst > 0.5, `${worst}`);
  });

  test('a trial forward runs at the anchor or at anchor + scale·change; anything else is a typed error', () => {
    assert.deepEqual(parseTrialForward({ weights: 'anchor' }), { weights: 'anchor', scale: 1 });
    assert.deepEqual(parseTrialForward({ weights: 'current', scale: 0.5 }), { weights: 'current', scale: 0.5 });
    for (const body of [{}, { weights: 'other' }, { weights: 'current', scale: -1 }, { weights: 'current', scale: '2' }, { weights: 'current', scale: Infinity }]) {
      assert.throws(() => parseTrialForward(body), { name: 'InvalidMessageError' });
    }
  });
});

describe('scored contributions: replicas with local steps are scored on held-out data before each average (js backend)', () => {
  setBackend('js');
  let honest: Run;

  test('honest replicas: every round at or above the floor, nobody excluded', async () => {
    honest = await run(null);
    console.log(describeRounds('honest', honest));
    assert.deepEqual(honest.flagged, []);
    assert.equal(honest.rounds.length, STEPS / SYNC);
    for (const r of honest.rounds) for (const p of r.replicas) assert.ok(p.value >= SCORE_FLOOR && !p.standing.excluded, `${p.peer}: ${p.value}`);
  });

  for (const fault of ['free-ride', 'scale-grad'] as const) {
    test(`a '${fault}' replica: scored down in 2 rounds, excluded, the job replayed without it; the final loss within 1% of the honest job's`, async () => {
      const r = await run(fault);
      console.log(describeRounds(fault, r));
      console.log(`${fault}: final loss ${r.losses.at(-1)!.toFixed(5)} against the honest job's ${honest.losses.at(-1)!.toFixed(5)}; ${r.replayed} steps replayed`);
      assert.deepEqual(r.flagged, [r.cheater]);
      const mine = r.rounds.flatMap((x) => x.replicas.filter((p) => p.peer === r.cheater));
      assert.equal(mine.length, 2, 'scored in two rounds');
      for (const p of mine) assert.ok(p.value < SCORE_FLOOR, `the cheater's round value ${p.value}`);
      // honest replicas were never below the floor
      for (const x of r.rounds) for (const p of x.replicas.filter((q) => q.peer !== r.cheater)) assert.ok(p.value >= SCORE_FLOOR, `${p.peer}: ${p.value}`);
      assert.ok(r.replayed >= STEPS - 1);
      assert.ok(Math.abs(r.losses.at(-1)! / honest.losses.at(-1)! - 1) < 0.01);
    });
  }
});
