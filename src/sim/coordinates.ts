/**
 * The simulated peers' network coordinates (plan/vivaldi.ts, the workers' own update), moved by probes at a worker's
 * rate: PROBES_PER_ROUND others every PROBE_INTERVAL_MS (worker/probing.ts), taken at random (a worker probes the
 * longest unprobed of a random page of the registry, those it works with first).
 */
import { estimateRttMs, updateCoordinate } from '../plan/index.ts';
import { PROBE_INTERVAL_MS, PROBES_PER_ROUND } from '../worker/probing.ts';
import type { SimPeer } from './population.ts';
import type { Random } from './random.ts';
import { type Relay, rttMs } from './world.ts';

/** One round of every peer's probes over `ms` of virtual time: each of `online` measures its share of others at random. */
export function probeFor(online: readonly SimPeer[], ms: number, relay: Relay, rng: Random): void {
  const probes = Math.round((PROBES_PER_ROUND * ms) / PROBE_INTERVAL_MS);
  const random = () => rng.next();
  for (const p of online) {
    for (let k = 0; k < probes; k++) {
      const q = online[rng.below(online.length)];
      if (q !== p) p.coordinate = updateCoordinate(p.coordinate, q.coordinate, rttMs(p.place, q.place, relay), random);
    }
  }
}

/**
 * The median relative error of the round trips that `samples` random pairs of `peers` predict from their coordinates
 * (NaN with fewer than two peers: there is no pair).
 */
export function coordinateError(peers: readonly SimPeer[], relay: Relay, rng: Random, samples = 2_000): number {
  if (peers.length < 2) return Number.NaN;
  const errors: number[] = [];
  while (errors.length < samples) {
    const a = peers[rng.below(peers.length)];
    const b = peers[rng.below(peers.length)];
    if (a === b) continue;
    const truth = rttMs(a.place, b.place, relay);
    if (!(truth > 0)) continue;
    errors.push(Math.abs(estimateRttMs(a.coordinate, b.coordinate) - truth) / truth);
  }
  errors.sort((x, y) => x - y);
  return errors[errors.length >> 1];
}
