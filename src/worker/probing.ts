/**
 * Which workers a worker probes, and how much of what it measured it keeps: bounded however large the swarm, so that
 * each worker's probes, and the proximity it announces, do not grow with it (a worker's coordinate, plan/vivaldi.ts,
 * predicts the round trips it never measured).
 */
import type { PeerRecord, Proximity } from '../p2p/index.ts';

/** How often a worker re-measures its proximity to the other workers (a round of probes). */
export const PROBE_INTERVAL_MS = 10_000;
/** Other workers a worker probes a round at most. */
export const PROBES_PER_ROUND = 16;
/** Peers a worker keeps (and announces) its proximity to: the most recently measured. */
export const MAX_KEPT_PROXIMITY = 128;

/**
 * Of `peers` (a page of the registry), the workers to probe this round: those it works with first, then the longest
 * unprobed (never probed first, in the order given), PROBES_PER_ROUND at most.
 */
export function chooseProbes(
  peers: readonly PeerRecord[], self: string, partners: ReadonlySet<string>, proximity: Readonly<Record<string, Proximity>>,
  max = PROBES_PER_ROUND,
): PeerRecord[] {
  return peers
    .filter((p) => p.roles.includes('worker') && p.peerId !== self)
    .map((p, i) => ({ p, i }))
    .sort((a, b) => Number(partners.has(b.p.peerId)) - Number(partners.has(a.p.peerId))
      || (proximity[a.p.peerId]?.measuredAt ?? 0) - (proximity[b.p.peerId]?.measuredAt ?? 0) || a.i - b.i)
    .slice(0, max)
    .map(({ p }) => p);
}

/** Drops the entries measured longest ago past `max`. */
export function forgetOldest(proximity: Record<string, Proximity>, max = MAX_KEPT_PROXIMITY): void {
  const ids = Object.keys(proximity);
  if (ids.length <= max) return;
  ids.sort((a, b) => proximity[a].measuredAt - proximity[b].measuredAt);
  for (const id of ids.slice(0, ids.length - max)) delete proximity[id];
}
