import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { bubbleFraction, schedule, type ScheduleName, simulate, stageActions } from '../../src/pipeline/index.ts';

describe('pipeline schedules', () => {
  const cases: [number, number][] = [[1, 1], [2, 1], [2, 4], [3, 4], [3, 8], [4, 8], [4, 3], [5, 16], [8, 8]];
  for (const name of ['gpipe', '1f1b'] as ScheduleName[]) {
    for (const [p, m] of cases) {
      test(`${name} p=${p} m=${m}: dependencies hold, bubble = (p−1)/(m+p−1), memory bound`, () => {
        const plan = schedule(name, p, m);
        const sim = simulate(plan); // throws on a deadlock or a missing action
        assert.ok(Math.abs(sim.bubble - bubbleFraction(p, m)) < 1e-12, `bubble ${sim.bubble} vs ${bubbleFraction(p, m)}`);
        for (let s = 0; s < p; s++) {
          assert.equal(plan[s].length, 2 * m);
          if (name === '1f1b') assert.ok(sim.peakActivations[s] <= Math.min(p - s, m), `stage ${s} holds ${sim.peakActivations[s]}`);
          else assert.equal(sim.peakActivations[s], m);
        }
      });
    }
  }

  test('1F1B holds at most p activations where GPipe holds m', () => {
    const g = simulate(schedule('gpipe', 4, 16));
    const f = simulate(schedule('1f1b', 4, 16));
    assert.deepEqual(g.peakActivations, [16, 16, 16, 16]);
    assert.deepEqual(f.peakActivations, [4, 3, 2, 1]);
    assert.equal(f.makespan, g.makespan);
  });

  test('unequal stages: the slowest sets the pace', () => {
    const sim = simulate(schedule('1f1b', 3, 8), { forward: [1, 3, 1], backward: [2, 6, 2] });
    assert.ok(sim.makespan >= 8 * 9, `makespan ${sim.makespan}`);
    assert.ok(sim.busy[1] === 8 * 9);
  });

  test('two jobs interleaved on one worker keep each job\'s order and finish', () => {
    // a worker running stage 1 of job A and stage 0 of job B alternates their actions; each job's own order is unchanged
    const a = schedule('1f1b', 3, 4);
    const b = schedule('gpipe', 2, 4);
    const merged: string[] = [];
    for (let i = 0; i < 8; i++) merged.push(`A${a[1][i].op}${a[1][i].micro}`, `B${b[0][i].op}${b[0][i].micro}`);
    assert.deepEqual(merged.filter((x) => x[0] === 'A').map((x) => x.slice(1)), a[1].map((x) => `${x.op}${x.micro}`));
    simulate(a);
    simulate(b);
  });

  test('a replica runs the schedule over its share of the micro-batches', () => {
    const actions = stageActions('1f1b', [1, 3, 5, 7], 0, 3);
    assert.deepEqual(actions.map((a) => `${a.op}${a.micro}`), ['F1', 'F3', 'F5', 'B1', 'F7', 'B3', 'B5', 'B7']);
  });

  test('a deadlocking order is caught', () => {
    assert.throws(() => simulate([[{ op: 'F', micro: 0 }, { op: 'B', micro: 0 }, { op: 'F', micro: 1 }, { op: 'B', micro: 1 }],
      [{ op: 'F', micro: 1 }, { op: 'B', micro: 1 }, { op: 'F', micro: 0 }, { op: 'B', micro: 0 }]]), /deadlock/);
  });
});
