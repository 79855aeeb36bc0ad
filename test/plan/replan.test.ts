import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  type Device, type LayerCost, layerAware, type LinkMeasurement, linkTable, measuredLinks, parameterBalanced, REPLAN_GAIN, replan,
  shortName,
} from '../../src/plan/index.ts';

const layers: LayerCost[] = Array.from({ length: 6 }, (_, i) => ({ name: `h.${i}`, params: 100, bytes: 400, flopsPerToken: 2e5, activationBytesPerToken: 2048 }));
const device = (id: string, gflops = 1): Device => ({ id, memoryBytes: 1e9, gflops });
const mesh = (ids: string[], mbps: number, override: Record<string, number> = {}): LinkMeasurement[] =>
  ids.flatMap((from) => ids.filter((to) => to !== from).map((to) => ({ from, to, rttMs: 2, mbps: override[`${from}>${to}`] ?? mbps })));
const options = { tokens: 256 };

describe('re-planning', () => {
  test('a link the plan crosses slows from 1000 to 10 Mbit/s: a plan around it, with the reason and both predictions', () => {
    const ids = ['A', 'B', 'C'];
    const devices = ids.map((id) => device(id));
    const before = { devices, links: linkTable(mesh(ids, 1000)) };
    const current = parameterBalanced(layers, devices, { ...options, links: measuredLinks(before.links) });
    const now = { devices, links: linkTable(mesh(ids, 1000, { 'A>B': 10, 'B>A': 10 })) };
    const r = replan({ strategy: 'layer-aware', layers, current, now, before, options });
    assert.ok(r, 'a plan around the slow link is proposed');
    assert.match(r.reason, /^link A→B slowed from 1000 to 10 Mbit\/s: predicted 0\.73 s → 0\.32 s per step$/);
    assert.ok(r.proposed < r.current * (1 - REPLAN_GAIN));
    const chain = r.plan.stages.map((s) => s.device).join('');
    assert.ok(!chain.includes('AB') && !chain.includes('BA'), chain);
    // nothing changed: the running plan stays
    assert.equal(replan({ strategy: 'layer-aware', layers, current: r.plan, now, before: now, options }), null);
  });

  test('a plan made through a slow link (nothing changed since): the reason names the costliest hop the new plan leaves out', () => {
    const ids = ['A', 'B', 'C'];
    const devices = ids.map((id) => device(id));
    const swarm = { devices, links: linkTable(mesh(ids, 1000, { 'A>B': 10, 'B>A': 10 })) };
    const current = parameterBalanced(layers, devices, { ...options, links: measuredLinks(swarm.links) });
    const r = replan({ strategy: 'layer-aware', layers, current, now: swarm, before: swarm, options });
    assert.ok(r);
    assert.match(r.reason, /^the new plan leaves out link A→B \(10 Mbit\/s, 0\.42 s a step\): predicted 0\.73 s → 0\.32 s per step$/);
  });

  test('a faster worker joins: proposed, named as joined', () => {
    const devices = [device('A'), device('B')];
    const before = { devices, links: linkTable(mesh(['A', 'B'], 1000)) };
    const current = layerAware(layers, devices, { ...options, links: measuredLinks(before.links) });
    const joined = [...devices, device('12D3KooWjoinedXYZ123', 20)];
    const now = { devices: joined, links: linkTable(mesh(joined.map((d) => d.id), 1000)) };
    const r = replan({ strategy: 'layer-aware', layers, current, now, before, options });
    assert.ok(r);
    assert.match(r.reason, /^worker …XYZ123 joined: predicted [\d.]+ (s|ms) → [\d.]+ (s|ms) per step$/);
    assert.equal(shortName('12D3KooWjoinedXYZ123'), '…XYZ123');
  });

  test('a worker of the plan is gone: any plan that fits beats it', () => {
    const devices = ['A', 'B', 'C'].map((id) => device(id));
    const links = linkTable(mesh(['A', 'B', 'C'], 1000));
    const current = layerAware(layers, devices, { ...options, links: measuredLinks(links) });
    const gone = current.stages[1].device;
    const r = replan({ strategy: 'layer-aware', layers, current, now: { devices: devices.filter((d) => d.id !== gone), links }, options });
    assert.ok(r);
    assert.ok(r.reason.startsWith(`worker ${gone} left`), r.reason);
    assert.ok(!r.plan.stages.some((s) => s.device === gone));
  });

  test('a gain under the threshold is not worth moving sections for', () => {
    const devices = [device('A'), device('B')];
    const links = linkTable(mesh(['A', 'B'], 1000));
    const current = layerAware(layers, devices, { ...options, links: measuredLinks(links) });
    // a new worker 10% faster than the others: a better plan, but by less than REPLAN_GAIN
    const now = { devices: [...devices, device('C', 1.1)], links: linkTable(mesh(['A', 'B', 'C'], 1000)) };
    const r = replan({ strategy: 'layer-aware', layers, current, now, options });
    assert.equal(r, null);
    assert.ok(replan({ strategy: 'layer-aware', layers, current, now, options, gain: 0, minSeconds: 0 }), 'with no threshold it would move');
  });

  test('a gain of a few milliseconds a step (latency noise on fast links) is not worth moving sections for, however large a share', () => {
    const devices = [device('A'), device('B')];
    const current = layerAware(layers, devices, { ...options, links: measuredLinks(linkTable(mesh(['A', 'B'], 1000))) });
    const now = { devices: [...devices, device('C', 100)], links: linkTable(mesh(['A', 'B', 'C'], 1000)) };
    const fast = replan({ strategy: 'layer-aware', layers, current, now, options, minSeconds: 0 });
    assert.ok(fast && fast.current - fast.proposed > 0, 'a faster plan exists');
    assert.equal(replan({ strategy: 'layer-aware', layers, current, now, options, minSeconds: 1e3 }), null);
  });

  test('the running plan\'s memory counts as free on its own workers', () => {
    // each worker has room for exactly its section: the free memory it reports now excludes what the plan holds
    const devices = ['A', 'B'].map((id) => ({ id, memoryBytes: 1200, gflops: 1 }));
    const links = linkTable(mesh(['A', 'B'], 1000));
    const current = parameterBalanced(layers, devices, { ...options, links: measuredLinks(links) });
    const now = { devices: devices.map((d) => ({ ...d, memoryBytes: 0 })), links: linkTable(mesh(['A', 'B'], 1000, { 'A>B': 1, 'B>A': 1 })) };
    const r = replan({ strategy: 'layer-aware', layers, current, now, options });
    assert.equal(r, null, 'no plan fits in less than the sections hold: nothing to propose, and no error');
    const roomy = { ...now, devices: now.devices.map((d) => ({ ...d, memoryBytes: 1200 })) };
    const moved = replan({ strategy: 'layer-aware', layers, current, now: roomy, options });
    assert.ok(moved, 'with the sections\' memory counted back, one worker can take the whole model and skip the slow link');
    assert.equal(moved.plan.stages.length, 1);
  });
});
