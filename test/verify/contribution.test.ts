import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import {
  byteLevelTokenizerJson, type CausalLM, countTargets, createModel, gpt2Config, HFTokenizer, LocalTrainer, microBatchLoss,
  type TrainingBatch,
} from '../../src/models/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import {
  type ContributionScore, cosineSimilarity, duplicateGroups, FLAGGED_SCORE, heldOutLoss, heldOutLossAfter, type ReplicaGradients,
  scoreContributions,
} from '../../src/verify/contribution.ts';

type Grads = Map<string, Float32Array>;

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 2, heads: 4, maxPositions: 32 });
/** Steps trained before the round that is scored. */
const TRAIN_STEPS = 12;
/** The step whose gradient the stale replica sends in the scored round: the initial weights', 12 steps old. */
const STALE_STEP = 0;
/** The SGD step the held-out evaluation takes. */
const EVAL_LR = 0.1;

function grads(entries: Record<string, number[]>): Grads {
  return new Map(Object.entries(entries).map(([n, v]) => [n, new Float32Array(v)]));
}

/** The gradient of the mean cross-entropy on `batch` at the model's current weights. */
function gradientOf(model: CausalLM, batch: TrainingBatch): Grads {
  model.zeroGrad();
  microBatchLoss(model.forward(batch.input), batch.target, countTargets(batch.target)).backward();
  const out: Grads = new Map();
  for (const [name, p] of model.namedParameters()) out.set(name, p.grad ? (p.grad.data as Float32Array).slice() : new Float32Array(p.size));
  model.zeroGrad();
  return out;
}

function norm(g: Grads): number {
  let s = 0;
  for (const x of g.values()) for (const v of x) s += v * v;
  return Math.sqrt(s);
}

/** Gaussian noise with the norm of `like`. */
function noiseLike(like: Grads, rng: Generator): Grads {
  const out: Grads = new Map([...like].map(([n, x]) => [n, Float32Array.from(x, () => rng.normal())]));
  const scale = norm(like) / norm(out);
  for (const x of out.values()) for (let k = 0; k < x.length; k++) x[k] *= scale;
  return out;
}

interface Round {
  honest: ReplicaGradients[];
  riders: ReplicaGradients[];
  scores: ContributionScore[];
  model: CausalLM;
  heldOut: TrainingBatch;
}

/** Trains a small GPT-2 on addition, then scores one data-parallel round of 3 honest replicas and 4 free riders. */
function round(seed: number): Round {
  const task = additionTask({ seed });
  const rng = new Generator(100 + seed);
  const model = createModel(config, { seed });
  const trainer = new LocalTrainer(model, { lr: 3e-3, totalSteps: 40, warmupSteps: 3 });
  let stale: Grads | null = null;
  for (let s = 0; s < TRAIN_STEPS; s++) {
    const batch = taskBatch(task, tok, rng, 8, 256);
    if (s === STALE_STEP) stale = gradientOf(model, batch);
    trainer.step(batch);
  }
  const honest = ['honest-0', 'honest-1', 'honest-2'].map((peer) => ({ peer, grads: gradientOf(model, taskBatch(task, tok, rng, 8, 256)) }));
  const heldOut = taskBatch(task, tok, rng, 16, 256);
  const riders: ReplicaGradients[] = [
    { peer: 'zero', grads: new Map([...honest[0].grads].map(([n, x]) => [n, new Float32Array(x.length)])) },
    { peer: 'copy-of-honest-2', grads: new Map([...honest[2].grads].map(([n, x]) => [n, x.slice()])) },
    { peer: 'stale', grads: stale! },
    { peer: 'noise', grads: noiseLike(honest[1].grads, new Generator(seed)) },
  ];
  const scores = scoreContributions([...honest, ...riders], heldOutLoss(model, heldOut), heldOutLossAfter(model, heldOut, EVAL_LR));
  return { honest, riders, scores, model, heldOut };
}

describe('contribution scoring: pure parts', () => {
  test('cosine similarity: values, missing parameters as zeros, 0 for a zero gradient', () => {
    const a = grads({ w: [1, 0], b: [0] });
    assert.ok(Math.abs(cosineSimilarity(a, grads({ w: [1, 1] })) - Math.SQRT1_2) < 1e-12);
    assert.equal(cosineSimilarity(a, grads({ w: [-2, 0], b: [0] })), -1);
    assert.equal(cosineSimilarity(a, grads({ b: [3] })), 0);
    assert.equal(cosineSimilarity(a, grads({ w: [0, 0] })), 0);
    assert.equal(cosineSimilarity(grads({ w: [0, 0] }), grads({ w: [0, 0] })), 0);
    assert.equal(cosineSimilarity(grads({ w: [3, 4] }), grads({ w: [6, 8] })), 1);
  });

  test('duplicates: bit-identical groups only, every member of a group, -0 and +0 differ', () => {
    const r = (peer: string, g: Grads): ReplicaGradients => ({ peer, grads: g });
    const replicas = [
      r('a', grads({ w: [1, 2], b: [3] })),
      r('b', grads({ w: [1, 2], b: [3.0000002] })),
      r('c', grads({ b: [3], w: [1, 2] })),
      r('d', grads({ w: [0, 0] })),
      r('e', grads({ w: [0, 0], b: [0] })),
      r('f', grads({ w: [-0, 0] })),
      r('g', grads({ w: [1, 2], b: [3] })),
    ];
    assert.deepEqual(duplicateGroups(replicas), [[0, 2, 6], [3, 4]]);
    assert.deepEqual(duplicateGroups(replicas.slice(0, 2)), []);
    assert.throws(() => duplicateGroups([r('a', grads({ w: [1] })), r('b', grads({ w: [1, 2] }))]), { name: 'InvalidArgumentError' });
  });

  test('scores: the formula on a linear loss, flagged replicas at the bottom, lossAfter once per distinct gradient', () => {
    // a loss linear in the step: L(w − g) = 5 − 0.1·(g₀ + g₁)
    const calls: Grads[] = [];
    const lossAfter = (g: Grads) => {
      calls.push(g);
      const w = g.get('w') ?? new Float32Array(2);
      return 5 - 0.1 * (w[0] + w[1]);
    };
    const replicas: ReplicaGradients[] = [
      { peer: 'a', grads: grads({ w: [2, 0] }) },
      { peer: 'b', grads: grads({ w: [0, 1] }) },
      { peer: 'zero', grads: grads({ w: [0, 0] }) },
      { peer: 'c1', grads: grads({ w: [1, 1] }) },
      { peer: 'c2', grads: grads({ w: [1, 1] }) },
      { peer: 'nan', grads: grads({ w: [Number.NaN, 1] }) },
      { peer: 'anti', grads: grads({ w: [-1, -1] }) },
    ];
    const s = scoreContributions(replicas, 5, lossAfter);
    assert.equal(calls.length, 4); // a, b, the c group once, anti
    const by = new Map(s.map((x) => [x.peer, x]));
    const close = (x: number, y: number) => assert.ok(Math.abs(x - y) < 1e-6, `${x} ≠ ${y}`);
    // the consensus C is a, b, anti (c1 and c2 are duplicates); ν = median(2, 1, √2) = √2
    const nu = Math.SQRT2;
    close(norm(calls[0]), nu);
    close(by.get('a')!.improvement, 0.1 * nu);
    close(by.get('b')!.improvement, 0.1 * nu);
    close(by.get('anti')!.improvement, -0.2);
    close(by.get('c2')!.improvement, 0.2);
    assert.equal(by.get('zero')!.improvement, 0);
    assert.equal(by.get('nan')!.improvement, Number.NEGATIVE_INFINITY);
    close(by.get('a')!.agreement, cosineSimilarity(grads({ w: [2, 0] }), grads({ w: [-1, 0] })));
    close(by.get('b')!.agreement, cosineSimilarity(grads({ w: [0, 1] }), grads({ w: [1, -1] })));
    close(by.get('anti')!.agreement, cosineSimilarity(grads({ w: [-1, -1] }), grads({ w: [2, 1] })));
    close(by.get('c1')!.agreement, cosineSimilarity(grads({ w: [1, 1] }), grads({ w: [1, 0] })));
    // scores: improvement / max |improvement| over a, b, anti (0.2), plus agreement
    close(by.get('a')!.score, (0.1 * nu) / 0.2 + by.get('a')!.agreement);
    close(by.get('b')!.score, (0.1 * nu) / 0.2 + by.get('b')!.agreement);
    close(by.get('anti')!.score, -0.2 / 0.2 + by.get('anti')!.agreement);
    for (const peer of ['zero', 'c1', 'c2', 'nan']) assert.equal(by.get(peer)!.score, FLAGGED_SCORE, peer);
    assert.deepEqual(s.map((x) => x.duplicate), [false, false, false, true, true, false, false]);
    // a step that makes the loss non-finite is flagged too (ν = 1.5: a steps to w₀ = 1.5)
    const blowUp = scoreContributions(replicas.slice(0, 2), 5, (g) => (g.get('w')![0] > 1 ? Number.POSITIVE_INFINITY : 4));
    assert.deepEqual(blowUp.map((x) => [x.improvement, x.score]), [[Number.NEGATIVE_INFINITY, FLAGGED_SCORE], [1, 1]]);
    assert.throws(() => scoreContributions([replicas[0], replicas[0]], 5, lossAfter), { name: 'InvalidArgumentError' });
  });

  test('scores: inflating a gradient does not raise its improvement (every step has the common length)', () => {
    const loss = (g: Grads) => 5 - 0.1 * g.get('w')![0] + 0.05 * g.get('w')![0] ** 2;
    const s = scoreContributions(
      [
        { peer: 'a', grads: grads({ w: [1, 0.5] }) },
        { peer: 'b', grads: grads({ w: [1, -0.5] }) },
        { peer: 'a-times-100', grads: grads({ w: [100, 50] }) },
      ],
      5,
      loss,
    );
    assert.ok(Math.abs(s[2].improvement - s[0].improvement) < 1e-6, JSON.stringify(s));
    assert.ok(s[2].score <= s[0].score + 1e-6);
  });
});

describe('contribution scoring: a small GPT-2 on addition (js backend)', () => {
  setBackend('js');

  test('heldOutLossAfter: the loss after w − lr·g, the weights restored bit for bit', () => {
    const model = createModel(config, { seed: 5 });
    const task = additionTask({ seed: 1 });
    const rng = new Generator(3);
    const batch = taskBatch(task, tok, rng, 8, 256);
    const heldOut = taskBatch(task, tok, rng, 8, 256);
    const before = new Map([...model.namedParameters()].map(([n, p]) => [n, { array: p.data, copy: p.data.slice() }]));
    const g = gradientOf(model, batch);
    const after = heldOutLossAfter(model, heldOut, 0.5);
    const lossBefore = heldOutLoss(model, heldOut);
    assert.equal(after(new Map()), lossBefore);
    const stepped = after(g);
    assert.ok(stepped < lossBefore, `${stepped} < ${lossBefore}`);
    for (const [n, p] of model.namedParameters()) {
      assert.equal(p.data, before.get(n)!.array, n);
      assert.deepEqual(p.data, before.get(n)!.copy, n);
    }
    assert.equal(heldOutLoss(model, heldOut), lossBefore);
    // the same step taken for real gives the same loss
    const copy = createModel(config, { seed: 5 });
    for (const [n, p] of copy.namedParameters()) {
      const x = p.data as Float32Array;
      const gn = g.get(n)!;
      for (let k = 0; k < x.length; k++) x[k] = x[k] - 0.5 * gn[k];
    }
    assert.equal(heldOutLoss(copy, heldOut), stepped);
    assert.throws(() => after(new Map([['nope', new Float32Array(1)]])), { name: 'InvalidArgumentError' });
    assert.throws(() => after(new Map([['transformer.wte.weight', new Float32Array(3)]])), { name: 'InvalidArgumentError' });
  });

  for (const seed of [1, 2, 3, 4, 5, 6]) {
    test(`seed ${seed}: every free rider (zero, copy, stale, noise) scores below every honest replica`, () => {
      const { scores } = round(seed);
      const by = new Map(scores.map((s) => [s.peer, s]));
      // the copy and its original cannot be told apart: both are flagged
      assert.deepEqual(scores.filter((s) => s.duplicate).map((s) => s.peer), ['honest-2', 'copy-of-honest-2']);
      assert.equal(by.get('zero')!.score, FLAGGED_SCORE);
      const honest = ['honest-0', 'honest-1'].map((p) => by.get(p)!);
      const riders = ['zero', 'copy-of-honest-2', 'stale', 'noise'].map((p) => by.get(p)!);
      for (const h of honest) {
        assert.ok(h.improvement > 0 && h.agreement > 0, `${h.peer}: ${JSON.stringify(h)}`);
        for (const r of riders) assert.ok(r.score < h.score, `${r.peer} (${r.score}) < ${h.peer} (${h.score})`);
      }
    });
  }
});
