import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  type Device, type LayerCost, layerAware, type LinkMeasurement, linkTable, measuredLinks, MIN_MBPS, parameterBalanced, type Plan,
  type PlanOptions, stageHops, stageTimer, stepSeconds,
} from '../../src/plan/index.ts';
import { Generator } from '../../src/tensor/index.ts';

const GBIT = 1000;
const SLOW = 10;

/** Every ordered pair of `ids` at `mbps` (and `rttMs`), with some pairs overridden. */
function mesh(ids: string[], mbps: number, rttMs: number, override: Record<string, number> = {}): LinkMeasurement[] {
  return ids.flatMap((from) => ids.filter((to) => to !== from).map((to) => ({ from, to, rttMs, mbps: override[`${from}>${to}`] ?? mbps })));
}

function blocks(n: number, flopsPerToken: number, activationBytesPerToken: number): LayerCost[] {
  return Array.from({ length: n }, (_, i) => ({ name: `h.${i}`, params: 100, bytes: 400, flopsPerToken, activationBytesPerToken }));
}

const equal = (ids: string[], gflops = 1): Device[] => ids.map((id) => ({ id, memoryBytes: 1e9, gflops }));

/** Consecutive device pairs of a plan's chain. */
const hops = (p: Plan) => p.stages.slice(1).map((s, i) => `${p.stages[i].device}>${s.device}`);

describe('measured links', () => {
  test('a measurement becomes a one-way latency in s (rtt / 2) and bytes/s (Mbit/s · 10⁶ / 8); one direction stands for both', () => {
    const links = measuredLinks(linkTable([{ from: 'a', to: 'b', rttMs: 10, mbps: 8 }, { from: 'c', to: 'a', rttMs: 4, mbps: 0 }]));
    assert.equal(links.latency!('a', 'b'), 0.005);
    assert.equal(links.bandwidth!('a', 'b'), 1e6);
    assert.equal(links.bandwidth!('b', 'a'), 1e6, 'the reverse direction is taken when a pair was measured one way');
    assert.equal(links.bandwidth!('c', 'a'), (MIN_MBPS * 1e6) / 8, 'a link that reads 0 Mbit/s counts as very slow, not as infinitely slow');
    assert.equal(links.bandwidth!('b', 'c'), undefined, 'a pair measured neither way takes the defaults');
    // the direction measured wins over the reverse
    const both = measuredLinks(linkTable([{ from: 'a', to: 'b', rttMs: 1, mbps: 8 }, { from: 'b', to: 'a', rttMs: 1, mbps: 80 }]));
    assert.equal(both.bandwidth!('b', 'a'), 1e7);
  });

  test('α and β: a hop costs α one-way latencies and β bytes per step (chain, relay, training)', () => {
    const layers = blocks(4, 1000, 64);
    const latency = 0.002;
    const bandwidth = 1e6;
    const links = { defaultLatency: latency, defaultBandwidth: bandwidth };
    const opts = (o: PlanOptions): PlanOptions => ({ tokens: 10, links, user: 'u', inputBytesPerToken: 8, ...o });
    // chain: the first stage takes the user's input (8 bytes a token), the last sends its output to the user
    assert.deepEqual(stageHops(layers, 0, 2, 'a', 'b', true, opts({})), [
      { from: 'u', to: 'a', alpha: 1, beta: 80 }, { from: 'a', to: 'b', alpha: 1, beta: 640 },
    ]);
    assert.deepEqual(stageHops(layers, 2, 4, 'b', null, false, opts({})), [{ from: 'b', to: 'u', alpha: 1, beta: 640 }]);
    // relay: the user passes every stage its input and takes its output
    assert.deepEqual(stageHops(layers, 2, 4, 'b', null, false, opts({ traffic: 'relay' })), [
      { from: 'u', to: 'b', alpha: 1, beta: 640 }, { from: 'b', to: 'u', alpha: 1, beta: 640 },
    ]);
    // training, 4 micro-batches, worker to worker: the user's requests and answers (8 each way) and the first stage's
    // input and its gradient (4 each way, 80 bytes); activations to the next stage and their gradients back (4 each way, 640 bytes)
    assert.deepEqual(stageHops(layers, 0, 2, 'a', 'b', true, opts({ traffic: 'train', microBatches: 4 })), [
      { from: 'u', to: 'a', alpha: 12, beta: 80 }, { from: 'a', to: 'u', alpha: 12, beta: 80 },
      { from: 'a', to: 'b', alpha: 4, beta: 640 }, { from: 'b', to: 'a', alpha: 4, beta: 640 },
    ]);
    // the last stage: its output to the user and the loss's gradient back, with the requests and answers
    assert.deepEqual(stageHops(layers, 2, 4, 'b', null, false, opts({ traffic: 'train', microBatches: 4 })), [
      { from: 'u', to: 'b', alpha: 12, beta: 640 }, { from: 'b', to: 'u', alpha: 12, beta: 640 },
    ]);
    // the stage's time is its compute plus Σ α·latency + β/bandwidth over its hops
    const order = equal(['a', 'b'], 1e-3);
    const compute = (2 * 1000 * 10) / 1e6;
    assert.ok(Math.abs(stageTimer(layers, order, opts({}))(0, 2, 0) - (compute + 2 * latency + (80 + 640) / bandwidth)) < 1e-12);
    const train = stageTimer(layers, order, opts({ traffic: 'train', microBatches: 4 }));
    assert.ok(Math.abs(train(0, 2, 0) - (3 * compute + 32 * latency + (2 * 80 + 2 * 640) / bandwidth)) < 1e-12);
    assert.ok(Math.abs(train(2, 4, 1) - (3 * compute + 24 * latency + (2 * 640) / bandwidth)) < 1e-12);
  });

  test('layer-aware never puts B right after A when A→B is 10 Mbit/s and the rest 1 Gbit/s, and beats the order A, B, C by the predicted factor', () => {
    const ids = ['A', 'B', 'C'];
    const links = measuredLinks(linkTable(mesh(ids, GBIT, 2, { 'A>B': SLOW })));
    const layers = blocks(6, 2e5, 2048);
    const devices = equal(ids);
    for (const tokens of [1, 16, 256, 4096]) {
      const p = layerAware(layers, devices, { tokens, links });
      assert.ok(!hops(p).includes('A>B'), `tokens ${tokens}: ${hops(p).join(' ')}`);
    }
    const tokens = 256;
    const good = layerAware(layers, devices, { tokens, links });
    const bad = parameterBalanced(layers, devices, { tokens, links });
    assert.deepEqual(bad.stages.map((s) => s.device), ['A', 'B', 'C']);
    // by hand: two layers a stage, compute c; a hop pays the one-way latency and 256 · 2048 bytes
    const c = (2 * 2e5 * tokens) / 1e9;
    const lat = 0.001;
    const bytes = tokens * 2048;
    const expected = (c + lat + bytes / ((SLOW * 1e6) / 8)) / (c + lat + bytes / ((GBIT * 1e6) / 8));
    assert.equal(good.stages.length, 3);
    assert.ok(Math.abs(bad.bottleneckSeconds / good.bottleneckSeconds - expected) < 1e-9, `${bad.bottleneckSeconds / good.bottleneckSeconds} vs ${expected}`);
    assert.ok(expected > 4.5, `the slow hop dominates: ${expected}`);
    // one step alone (a forward through the chain: the sum of the stages) is faster too
    const [slow, fast] = [bytes / ((SLOW * 1e6) / 8), bytes / ((GBIT * 1e6) / 8)];
    const alone = (3 * c + 2 * lat + slow + fast) / (3 * c + 2 * lat + 2 * fast);
    assert.ok(Math.abs(stepSeconds(bad) / stepSeconds(good) - alone) < 1e-9, `${stepSeconds(bad) / stepSeconds(good)} vs ${alone}`);
  });

  test('with the user given, a worker behind a slow user link is kept off the chain\'s ends', () => {
    const ids = ['A', 'B', 'C'];
    const links = measuredLinks(linkTable([...mesh(ids, GBIT, 2), ...ids.map((id) => ({ from: 'U', to: id, rttMs: 2, mbps: id === 'A' ? SLOW : GBIT }))]));
    const layers = blocks(6, 2e5, 2048);
    const p = layerAware(layers, equal(ids), { tokens: 256, links, user: 'U' });
    assert.equal(p.stages.length, 3);
    assert.notEqual(p.stages[0].device, 'A');
    assert.notEqual(p.stages.at(-1)!.device, 'A');
    // without the user in the plan, its slow link is invisible
    const blind = parameterBalanced(layers, equal(ids), { tokens: 256, links });
    const seen = parameterBalanced(layers, equal(ids), { tokens: 256, links, user: 'U' });
    assert.ok(seen.stages[0].seconds > blind.stages[0].seconds + 0.4, 'the user → A hop is charged to the first stage');
  });

  test('layer-aware finds the smallest bottleneck, then the fastest single step among those (brute force, measured links, user ends)', () => {
    const rng = new Generator(7);
    for (let trial = 0; trial < 60; trial++) {
      const n = 2 + rng.int(4);
      const layers: LayerCost[] = Array.from({ length: n }, (_, i) => ({
        name: `l${i}`, params: 10, bytes: 40 * (1 + rng.int(5)), flopsPerToken: 1e3 * (1 + rng.int(5)), activationBytesPerToken: 64 * (1 + rng.int(8)),
      }));
      const ids = Array.from({ length: 1 + rng.int(3) }, (_, i) => `d${i}`);
      const devices = ids.map((id) => ({ id, memoryBytes: 80 + 40 * rng.int(8), gflops: 1e-3 * (1 + rng.int(3)) }));
      const measured = [...ids, 'u'].flatMap((from) => ids.filter((to) => to !== from).map((to) => ({ from, to, rttMs: 0.2 * rng.int(20), mbps: [1, 10, 1000][rng.int(3)] })));
      const options: PlanOptions = { tokens: 32, links: measuredLinks(linkTable(measured)), user: 'u' };
      let best: [number, number] | null = null;
      for (const order of orderedSubsets(devices)) {
        if (order.length > n) continue;
        const time = stageTimer(layers, order, options);
        for (const cuts of allCuts(n, order.length)) {
          if (order.some((d, i) => layers.slice(cuts[i], cuts[i + 1]).reduce((a, l) => a + l.bytes, 0) > d.memoryBytes)) continue;
          const t = order.map((_, i) => time(cuts[i], cuts[i + 1], i));
          const v: [number, number] = [Math.max(...t), t.reduce((a, b) => a + b, 0)];
          if (!best || v[0] < best[0] * (1 - 1e-9) || (v[0] <= best[0] * (1 + 1e-9) && v[1] < best[1])) best = v;
        }
      }
      if (!best) {
        assert.throws(() => layerAware(layers, devices, options), { name: 'PlanInfeasibleError' });
        continue;
      }
      const p = layerAware(layers, devices, options);
      assert.ok(Math.abs(p.bottleneckSeconds - best[0]) <= best[0] * 1e-9, `trial ${trial}: bottleneck ${p.bottleneckSeconds} vs ${best[0]}`);
      assert.ok(Math.abs(stepSeconds(p) - best[1]) <= best[1] * 1e-6, `trial ${trial}: step ${stepSeconds(p)} vs ${best[1]}`);
    }
  });

  test('beyond six devices the chain is reordered around slow links', () => {
    const ids = Array.from({ length: 8 }, (_, i) => `d${i}`);
    const slow = { 'd0>d1': 1, 'd1>d0': 1, 'd2>d3': 1, 'd3>d2': 1, 'd4>d5': 1, 'd5>d4': 1 };
    const links = measuredLinks(linkTable(mesh(ids, GBIT, 1, slow)));
    const p = layerAware(blocks(16, 2e5, 4096), equal(ids), { tokens: 256, links });
    assert.ok(p.stages.length >= 4, `the work is spread: ${p.stages.length} stages`);
    for (const h of hops(p)) assert.ok(!(h in slow), `${hops(p).join(' ')} crosses ${h}`);
  });
});

function* allCuts(n: number, k: number, start = 0): IterableIterator<number[]> {
  if (k === 1) {
    yield [start, n];
    return;
  }
  for (let c = start + 1; c <= n - k + 1; c++) for (const rest of allCuts(n, k - 1, c)) yield [start, ...rest];
}

function* orderedSubsets<T>(items: T[]): IterableIterator<T[]> {
  const rec = function* (chosen: T[], left: T[], k: number): IterableIterator<T[]> {
    if (chosen.length === k) {
      yield chosen;
      return;
    }
    for (let i = 0; i < left.length; i++) yield* rec([...chosen, left[i]], [...left.slice(0, i), ...left.slice(i + 1)], k);
  };
  for (let k = 1; k <= items.length; k++) yield* rec([], items, k);
}
