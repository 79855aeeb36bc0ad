// Issue #50: a plan over a large swarm weighs only its fastest PLAN_CANDIDATES workers: the planner never picks a slower
// one over them, and its work stops growing with the swarm.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { type Device, type LayerCost, plan, PLAN_CANDIDATES, planCandidates } from '../../src/plan/index.ts';
import { Generator } from '../../src/tensor/index.ts';

const layers: LayerCost[] = Array.from({ length: 24 }, (_, i) => ({
  name: `l${i}`, params: 1e7, bytes: 4e7, flopsPerToken: 2e7, activationBytesPerToken: 4096,
}));

describe('plan candidates', () => {
  test('the fastest PLAN_CANDIDATES, in the order given; a small swarm as it is; four a layer for a deep model', () => {
    const rng = new Generator(1);
    const devices: Device[] = Array.from({ length: 2000 }, (_, i) => ({ id: `d${i}`, memoryBytes: 2 ** 30 * (1 + rng.int(16)), gflops: 1 + rng.int(10_000) }));
    const kept = planCandidates(devices, 24);
    assert.equal(kept.length, PLAN_CANDIDATES);
    const slowestKept = Math.min(...kept.map((d) => d.gflops));
    assert.ok(devices.filter((d) => !kept.includes(d)).every((d) => d.gflops <= slowestKept), 'none left out is faster');
    assert.deepEqual(kept, devices.filter((d) => kept.includes(d)), 'in the order given');
    assert.deepEqual(planCandidates(devices.slice(0, 100), 24), devices.slice(0, 100));
    assert.equal(planCandidates(devices, 100).length, 400);
  });

  test('over 2,000 workers, the layer-aware plan over the candidates is the plan over all of them', () => {
    // (parameter-balanced takes devices in the order given, whatever their speed: the first of those kept)
    const rng = new Generator(2);
    const devices: Device[] = Array.from({ length: 2000 }, (_, i) => ({ id: `d${i}`, memoryBytes: 2 ** 27 * (1 + rng.int(8)), gflops: 1 + rng.int(10_000) }));
    const all = plan('layer-aware', layers, devices, { tokens: 512 });
    const some = plan('layer-aware', layers, planCandidates(devices, layers.length), { tokens: 512 });
    assert.deepEqual(some.stages, all.stages);
  });
});
