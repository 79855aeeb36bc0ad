import type { Links } from './types.ts';

/**
 * Measured links as the planner reads them. Peers measure round trips (ms) and bandwidths
 * (Mbit/s); the planner prices a hop in seconds from a one-way latency (s) and bytes per second.
 */

/** One measurement of the link from one device to another, in the units peers announce. */
export interface LinkMeasurement {
  from: string;
  to: string;
  /** Round trip of a small message, ms. */
  rttMs: number;
  /** Bandwidth achieved from `from` to `to`, Mbit/s. */
  mbps: number;
  /** When it was measured (ms since the epoch): of two measurements of a pair, the later counts. */
  at?: number;
}

/** A link in the planner's units. */
export interface LinkEstimate {
  /** One-way latency, s: half the round trip. */
  latency: number;
  /** Bytes per second. */
  bandwidth: number;
}

/** Measured links: from → to → estimate. */
export type LinkTable = ReadonlyMap<string, ReadonlyMap<string, LinkEstimate>>;

/**
 * The slowest bandwidth a measurement is taken at (Mbit/s). Peers round to 0.1 Mbit/s, so a
 * link that crawls reads 0: it counts as this slow, not as infinitely slow (a plan over it
 * stays comparable with the others, and a later measurement can bring it back).
 */
export const MIN_MBPS = 0.01;

/** The planner's estimate of a measurement: latency = rtt / 2, bytes/s = Mbit/s · 10⁶ / 8. */
export function estimateOf(m: { rttMs: number; mbps: number }): LinkEstimate {
  return { latency: Math.max(0, m.rttMs) / 2 / 1000, bandwidth: (Math.max(MIN_MBPS, m.mbps) * 1e6) / 8 };
}

/** Measurements into a table: of two of the same pair, the one measured later (by `at`; else the one listed later). */
export function linkTable(measurements: Iterable<LinkMeasurement>): LinkTable {
  const table = new Map<string, Map<string, LinkEstimate>>();
  const when = new Map<string, number>();
  for (const m of measurements) {
    if (m.from === m.to || !Number.isFinite(m.rttMs) || !Number.isFinite(m.mbps)) continue;
    const key = `${m.from}>${m.to}`;
    const at = m.at ?? Number.POSITIVE_INFINITY;
    if ((when.get(key) ?? Number.NEGATIVE_INFINITY) > at) continue;
    when.set(key, at);
    let row = table.get(m.from);
    if (!row) table.set(m.from, (row = new Map()));
    row.set(m.to, estimateOf(m));
  }
  return table;
}

/**
 * The estimate of the link from → to: its own measurement, else the reverse direction's (links
 * are mostly symmetric, and one measured way is better than a guess), else undefined.
 */
export function linkBetween(table: LinkTable, from: string, to: string): LinkEstimate | undefined {
  return table.get(from)?.get(to) ?? table.get(to)?.get(from);
}

/**
 * The planner's `Links` over a table of measurements; pairs measured neither way fall back on
 * `defaults` (and those on the planner's own: 100 MB/s, 5 ms).
 * @example
 * const links = measuredLinks(linkTable([{ from: 'a', to: 'b', rttMs: 2, mbps: 10 }]))
 * layerAware(costs, devices, { tokens: 256, links })
 */
export function measuredLinks(table: LinkTable, defaults: { defaultBandwidth?: number; defaultLatency?: number } = {}): Links {
  return {
    ...defaults,
    bandwidth: (from, to) => linkBetween(table, from, to)?.bandwidth,
    latency: (from, to) => linkBetween(table, from, to)?.latency,
  };
}

/** Bytes/s as Mbit/s, for people. */
export function mbitOf(bandwidth: number): number {
  return (bandwidth * 8) / 1e6;
}
