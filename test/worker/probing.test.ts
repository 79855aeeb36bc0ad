// Issue #50: a worker's probes and the proximity it announces stay bounded however large the swarm. Before, every
// worker probed every worker on the registry's first page: at 10,000 workers the first hundred by peer id would each
// take 10,000 probes every 10 s.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { PeerRecord, Proximity } from '../../src/p2p/index.ts';
import { chooseProbes, forgetOldest, MAX_KEPT_PROXIMITY, PROBES_PER_ROUND } from '../../src/worker/probing.ts';

const worker = (peerId: string): PeerRecord => ({ peerId, roles: ['worker'], capabilities: null, addrs: [], proximity: {}, lastSeen: 0 });
const seen = (measuredAt: number): Proximity => ({ rttMs: 1, mbps: 100, measuredAt });

describe('a worker\'s probes', () => {
  test('at most PROBES_PER_ROUND a round: the peers it works with first, then the longest unprobed', () => {
    const page = [{ ...worker('v'), roles: ['validator' as const] }, ...Array.from({ length: 100 }, (_, i) => worker(`w${String(i).padStart(3, '0')}`))];
    const proximity: Record<string, Proximity> = {};
    for (let i = 0; i < 100; i++) proximity[`w${String(i).padStart(3, '0')}`] = seen(1000 + i);
    delete proximity.w050;
    const chosen = chooseProbes(page, 'w000', new Set(['w099']), proximity).map((p) => p.peerId);
    assert.equal(chosen.length, PROBES_PER_ROUND);
    assert.deepEqual(chosen.slice(0, 3), ['w099', 'w050', 'w001'], 'a partner, the never probed, then the oldest');
    assert.ok(!chosen.includes('w000') && !chosen.includes('v'), 'not itself, not a validator');
    // rounds after rounds cover the page
    const covered = new Set<string>();
    for (let round = 0; round < 7; round++) {
      for (const p of chooseProbes(page, 'w000', new Set(), proximity)) {
        covered.add(p.peerId);
        proximity[p.peerId] = seen(10_000 + round);
      }
    }
    assert.equal(covered.size, 99);
  });

  test('what it keeps and announces: the MAX_KEPT_PROXIMITY most recently measured', () => {
    const proximity: Record<string, Proximity> = {};
    for (let i = 0; i < MAX_KEPT_PROXIMITY + 50; i++) proximity[`p${i}`] = seen(i);
    forgetOldest(proximity);
    assert.equal(Object.keys(proximity).length, MAX_KEPT_PROXIMITY);
    assert.ok(!('p49' in proximity) && 'p50' in proximity);
  });
});
