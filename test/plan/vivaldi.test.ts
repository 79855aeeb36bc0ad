// Issue #50: network coordinates (Vivaldi with heights) predict the round trip between nodes that never measured it,
// so a user can rank thousands of hosts having pinged a few.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { type Coordinate, estimateRttMs, fitCoordinate, origin, updateCoordinate } from '../../src/plan/index.ts';

/** A seeded uniform source (mulberry32). */
function seeded(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    let t = (s = (s + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Nodes on a plane 300 ms across, each with an access link of 1–30 ms: the true round trip is distance plus both. */
function world(n: number, random: () => number) {
  const nodes = Array.from({ length: n }, () => ({ p: [random() * 300, random() * 300], access: 1 + random() * 29 }));
  const rtt = (a: number, b: number) =>
    Math.hypot(nodes[a].p[0] - nodes[b].p[0], nodes[a].p[1] - nodes[b].p[1]) + nodes[a].access + nodes[b].access;
  return { nodes, rtt };
}

/** `n` nodes from the origin, 60 rounds in which each measures 4 others at random. */
function converge(n: number, rtt: (a: number, b: number) => number, random: () => number): Coordinate[] {
  let coords: Coordinate[] = Array.from({ length: n }, origin);
  for (let round = 0; round < 60; round++) {
    coords = coords.map((c, i) => {
      let next = c;
      for (let k = 0; k < 4; k++) {
        const j = Math.floor(random() * n);
        if (j !== i) next = updateCoordinate(next, coords[j], rtt(i, j), random);
      }
      return next;
    });
  }
  return coords;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

describe('Vivaldi coordinates', () => {
  test('nodes that each measure a few others a round predict every pair within 15% (median) after 60 rounds', () => {
    const random = seeded(1);
    const { rtt } = world(80, random);
    const coords = converge(80, rtt, random);
    const errors: number[] = [];
    for (let i = 0; i < 80; i++) {
      for (let j = i + 1; j < 80; j++) errors.push(Math.abs(estimateRttMs(coords[i], coords[j]) - rtt(i, j)) / rtt(i, j));
    }
    assert.ok(median(errors) < 0.15, `median relative error ${median(errors)}`);
    assert.ok(median(coords.map((c) => c.error)) < 0.5, 'the nodes\' own error estimates fall as they agree');
  });

  test('a newcomer fitted from round trips to 16 nodes predicts the rest, and ranks the nearest among them', () => {
    const random = seeded(2);
    const { rtt } = world(101, random);
    const coords = converge(100, rtt, random);
    // node 100 pings 16 of them and fits its coordinate
    const me = fitCoordinate(Array.from({ length: 16 }, (_, j) => ({ coordinate: coords[j], rttMs: rtt(100, j) })), 20, random);
    const others = Array.from({ length: 84 }, (_, k) => 16 + k);
    const errors = others.map((j) => Math.abs(estimateRttMs(me, coords[j]) - rtt(100, j)) / rtt(100, j));
    assert.ok(median(errors) < 0.2, `median relative error ${median(errors)}`);
    // of the ten it predicts nearest, most are among the true twenty nearest
    const byEstimate = [...others].sort((a, b) => estimateRttMs(me, coords[a]) - estimateRttMs(me, coords[b])).slice(0, 10);
    const nearest = new Set([...others].sort((a, b) => rtt(100, a) - rtt(100, b)).slice(0, 20));
    assert.ok(byEstimate.filter((j) => nearest.has(j)).length >= 7, `${byEstimate.filter((j) => nearest.has(j)).length} of 10`);
  });

  test('a sample that agrees moves nothing much; a coincident pair is pushed apart; a bad round trip is ignored', () => {
    const a: Coordinate = { x: [0, 0, 0], height: 5, error: 0.1 };
    const b: Coordinate = { x: [100, 0, 0], height: 5, error: 0.1 };
    const same = updateCoordinate(a, b, 110);
    assert.ok(Math.abs(estimateRttMs(same, b) - 110) < 1e-9);
    const apart = updateCoordinate(origin(), origin(), 50, seeded(3));
    assert.ok(estimateRttMs(apart, origin()) > 2 * 0.1);
    assert.equal(updateCoordinate(a, b, Number.NaN), a);
    assert.equal(updateCoordinate(a, b, 0), a);
  });
});
