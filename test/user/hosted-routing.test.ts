// Issue #31: a session's route is the one of least predicted latency: the round trips this user measures to each
// host, each host's blocks over its speed and its load, and a penalty for a host short of KV cache.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createNode, type HostedModelEntry, type PeerRecord, serveProbes } from '../../src/p2p/index.ts';
import {
  DEFAULT_RTT_MS, FIT_PINGS, hopRank, hostRoundTrips, ownCoordinate, pingOrder, plannedRtts, routeOver, unconfirmedHops,
} from '../../src/user/hosted-routing.ts';
import { type Coordinate, estimateRttMs } from '../../src/plan/index.ts';

const peer = (peerId: string, gflops = 100): PeerRecord => ({
  peerId, roles: ['worker'], addrs: [], proximity: {}, lastSeen: 0,
  capabilities: { memoryBytes: 2 ** 34, gflops, tier: 'C', cores: 8, backend: 'ort' },
});
const model = (hosts: [string, number, number, { sessions?: number; freeTokens?: number }?][]): HostedModelEntry => ({
  name: 'm', hash: '0'.repeat(64), layers: 8, complete: true,
  hosts: hosts.map(([peerId, a, b, extra]) => ({ peerId, layers: [a, b] as [number, number], format: 'f32' as const, state: 'online' as const, ...extra })),
});
const ids = (route: { peerId: string }[] | null) => route?.map((h) => h.peerId);

describe('routing a session over hosts', () => {
  // 1 GFLOP a block at 100 GFLOP/s: 10 ms a block
  const blockFlops = 1e9;

  test('the measured round trips decide between hosts of the same blocks', () => {
    const m = model([['near', 0, 7], ['far', 0, 7]]);
    const peers = [peer('near'), peer('far')];
    assert.deepEqual(ids(routeOver(m, peers, { blockFlops, rttMs: new Map([['near', 2], ['far', 120]]) })), ['near']);
    assert.deepEqual(ids(routeOver(m, peers, { blockFlops, rttMs: new Map([['near', 300], ['far', 120]]) })), ['far']);
    // none measured: the default round trip; some measured: those not measured count their median
    assert.deepEqual(ids(routeOver(m, peers, { blockFlops })), ['near'], 'alike: the first listed');
    const three = model([['a', 0, 3], ['b', 4, 7], ['whole', 0, 7]]);
    const rtt = new Map([['a', 1], ['b', 1]]);
    assert.deepEqual(ids(routeOver(three, [peer('a'), peer('b'), peer('whole')], { blockFlops, rttMs: rtt })), ['whole'], 'an unmeasured host counts 1 ms, not 50');
    assert.ok(DEFAULT_RTT_MS > 2 + 5);
  });

  test('two near hops beat one far hop; one hop beats two when the links are alike', () => {
    const m = model([['a', 0, 3], ['b', 4, 7], ['whole', 0, 7]]);
    const peers = [peer('a'), peer('b'), peer('whole')];
    assert.deepEqual(ids(routeOver(m, peers, { blockFlops, rttMs: new Map([['a', 5], ['b', 5], ['whole', 100]]) })), ['a', 'b']);
    assert.deepEqual(ids(routeOver(m, peers, { blockFlops, rttMs: new Map([['a', 30], ['b', 30], ['whole', 30]]) })), ['whole']);
  });

  test('a slow or loaded host loses to a fast idle one; one short of KV cache is avoided while another has room', () => {
    const rttMs = new Map([['slow', 10], ['fast', 10]]);
    // 8 blocks: 80 ms at 100 GFLOP/s, 800 ms at 10
    assert.deepEqual(ids(routeOver(model([['slow', 0, 7], ['fast', 0, 7]]), [peer('slow', 10), peer('fast', 100)], { blockFlops, rttMs })), ['fast']);
    const loaded = model([['slow', 0, 7], ['fast', 0, 7, { sessions: 160 }]]);
    assert.deepEqual(ids(routeOver(loaded, [peer('slow', 50), peer('fast', 100)], { blockFlops, rttMs })), ['slow'], '21× the time of an idle host');
    const full = model([['slow', 0, 7], ['fast', 0, 7, { freeTokens: 100 }]]);
    const peers = [peer('slow', 80), peer('fast', 100)];
    assert.deepEqual(ids(routeOver(full, peers, { blockFlops, rttMs, tokens: 512 })), ['slow']);
    assert.deepEqual(ids(routeOver(full, peers, { blockFlops, rttMs, tokens: 64 })), ['fast']);
  });

  test('a range, hosts to avoid, and no route', () => {
    const m = model([['a', 0, 3], ['b', 4, 7], ['c', 4, 7]]);
    const peers = [peer('a'), peer('b'), peer('c')];
    const rttMs = new Map([['b', 1], ['c', 2]]);
    assert.deepEqual(ids(routeOver(m, peers, { blockFlops, rttMs, from: 4 })), ['b']);
    assert.deepEqual(ids(routeOver(m, peers, { blockFlops, rttMs, from: 4, avoid: new Set(['b']) })), ['c']);
    assert.equal(routeOver(m, peers, { blockFlops, rttMs, avoid: new Set(['a']) }), null);
  });

  test('round trips measured on real sockets: a listening peer answers, one that is gone is left out', async () => {
    const [user, host, gone] = await Promise.all([createNode(), createNode(), createNode()]);
    try {
      // a worker answers probes (worker.ts): these two stand for hosts
      await Promise.all([serveProbes(host), serveProbes(gone)]);
      const record = (n: typeof host) => ({ ...peer(n.peerId.toString()), addrs: n.getMultiaddrs().map(String) });
      const hosts = [record(host), record(gone)];
      await gone.stop();
      const rtt = await hostRoundTrips(user, hosts, 2_000);
      assert.ok((rtt.get(host.peerId.toString()) ?? -1) >= 0 && rtt.get(host.peerId.toString())! < 100, `loopback round trip ${rtt.get(host.peerId.toString())} ms`);
      assert.equal(rtt.has(gone.peerId.toString()), false);
    } finally {
      await Promise.all([user.stop(), host.stop()]);
    }
  });

  // Issue #50: at thousands of hosts a user cannot ping them all. Hosts announce network coordinates (Vivaldi); the
  // user pings the hosts surest of theirs, fits its own, pings the most promising by the prediction, predicts the rest,
  // and pings a route's predicted hops before it trusts them (the simulation: 64% of routes within 10% of the best
  // with the first 64 hosts by peer id pinged, 96% so).
  test('with coordinates: the surest hosts pinged first, then the most promising by prediction; the rest predicted', () => {
    // hosts on an 8 × 5 grid 30 ms apart, their coordinates exact, their errors scattered over the grid
    const at = (x: number, y: number, error: number): Coordinate => ({ x: [x, y, 0], height: 0.1, error });
    const hosts = Array.from({ length: 40 }, (_, i) => ({
      ...peer(`h${String(i).padStart(2, '0')}`), coordinate: at(30 * (i % 8), 30 * Math.floor(i / 8), 0.05 + 0.01 * (((i * 7) % 40) + 1)),
    }));
    const bare = peer('no-coordinate');
    const all = [bare, ...hosts];
    // nothing measured: the FIT_PINGS surest of their coordinates, then those without one
    const surest = [...hosts].sort((x, y) => x.coordinate.error - y.coordinate.error).slice(0, FIT_PINGS);
    assert.deepEqual(pingOrder(all, new Map(), null, 64).map((h) => h.peerId), [...surest.map((h) => h.peerId), 'no-coordinate']);
    // a user at (100, 50) measures those, fits its own coordinate, and predicts the others
    const truth = (h: PeerRecord) => Math.hypot(100 - h.coordinate!.x[0], 50 - h.coordinate!.x[1]) + 0.2;
    const measured = new Map(surest.map((h) => [h.peerId, truth(h)]));
    const own = ownCoordinate(all, measured, () => 0.5)!;
    const others = hosts.filter((h) => !measured.has(h.peerId));
    const errors = others.map((h) => Math.abs(estimateRttMs(own, h.coordinate) - truth(h)) / truth(h)).sort((x, y) => x - y);
    assert.ok(errors[Math.floor(errors.length / 2)] < 0.2, `median relative error ${errors[Math.floor(errors.length / 2)]}`);
    // the next to ping: by prediction, among the truly nearest
    const next = pingOrder(all, measured, own, 3).map((h) => h.peerId);
    const nearest = new Set([...others].sort((x, y) => truth(x) - truth(y)).slice(0, 6).map((h) => h.peerId));
    assert.ok(next.every((id) => nearest.has(id)), `${next} among ${[...nearest]}`);
    // the planned round trips: measured ones as measured, the others predicted, a host without a coordinate left out
    const planned = plannedRtts(all, measured, own);
    assert.equal(planned.get(surest[0].peerId), measured.get(surest[0].peerId));
    assert.equal(planned.get(others[0].peerId), estimateRttMs(own, others[0].coordinate));
    assert.equal(planned.has('no-coordinate'), false);
    // a route through a predicted host and a measured one: only the predicted one is yet to be confirmed
    const hop = (peerId: string, layers: [number, number]) => ({ peerId, addrs: [], layers });
    const route = [hop(others[0].peerId, [0, 3]), hop(surest[0].peerId, [4, 7])];
    assert.deepEqual(unconfirmedHops(route, measured), [others[0].peerId]);
  });

  test('hopRank: a host that holds more blocks, or computes faster, ranks before one as near', () => {
    const m = model([['few', 0, 0], ['many', 0, 7], ['slow', 0, 7]]);
    const rank = hopRank(m, 1e9);
    assert.ok(rank(peer('many'), 40) < rank(peer('few'), 40), 'its round trip shared by eight blocks');
    assert.ok(rank(peer('many', 100), 40) < rank(peer('slow', 1), 40), 'a block at 100 GFLOP/s, not 1');
  });
});
