import type { Libp2p } from '@libp2p/interface';
import { type HostedModelEntry, type PeerRecord, roundTrip } from '../p2p/index.ts';
import type { RouteHop } from './hosted-session.ts';
import { type Coordinate, estimateRttMs, fitCoordinate } from '../plan/index.ts';
import { median } from '../verify/index.ts';

/** What a route is for, and what predicts its latency. */
export interface RouteOptions {
  /** The tokens a session will hold (hosts with fewer free KV-cache tokens are penalised). */
  tokens?: number;
  /** Hosts not to use (ones that failed or were caught). */
  avoid?: ReadonlySet<string>;
  /** The blocks [from, to) to cover (default: every block). */
  from?: number;
  to?: number;
  /**
   * Measured round trips from the user to hosts, in ms (hostRoundTrips); a host not measured counts the median of the
   * measured ones (its peers' links are the best guess of its own), or DEFAULT_RTT_MS when none is.
   */
  rttMs?: ReadonlyMap<string, number>;
  /** FLOPs of one block for one token (default DEFAULT_BLOCK_FLOPS): a host's blocks take this over its speed. */
  blockFlops?: number;
}

/** A round trip to a host when none of a route's hosts was measured (a user → host hop on a continent's internet). */
export const DEFAULT_RTT_MS = 50;
/**
 * What a hop costs beyond its round trip and its blocks (an estimate, not a measurement): the host's turn at the
 * request (its queue, the stream's framing) and the user's at the answer. It makes fewer hops win between hosts
 * whose round trips are alike (on one machine, pings of a millisecond or less that load makes jitter).
 */
export const HOP_OVERHEAD_MS = 5;
/** A block's FLOPs per token when the caller does not say (a 7B decoder's block: about 0.4 GFLOP). */
export const DEFAULT_BLOCK_FLOPS = 4e8;
/** Open sessions on a host that double its blocks' predicted time. */
const SESSIONS_PER_SLOWDOWN = 8;
/** A host short of KV cache for the session costs this many more (unmeasured) round trips on a route. */
const SHORT_OF_CACHE_HOPS = 4;
/** A host's speed when it announced none, in GFLOP/s. */
const DEFAULT_GFLOPS = 10;

/**
 * The route over a model's online hosts that covers blocks [from, to) (default: every block), in order, with the
 * least predicted latency per step, as Petals' clients choose: each hop costs its measured round trip from the user
 * (steps go user → host → user, host by host) and HOP_OVERHEAD_MS, plus its blocks' compute time (blocks × blockFlops over the host's
 * announced speed, slowed by its open sessions, SESSIONS_PER_SLOWDOWN of them doubling it), and a host with fewer free
 * KV-cache tokens than `tokens` costs SHORT_OF_CACHE_HOPS default round trips more. A shortest path over block
 * boundaries (the boundaries only move forward, so one pass in order is Dijkstra on this DAG); a host's span must lie
 * within the range. Null when no route covers it.
 */
export function routeOver(model: HostedModelEntry, peers: readonly PeerRecord[], options: RouteOptions = {}): RouteHop[] | null {
  const { tokens = 0, avoid = new Set<string>(), from = 0, to = model.layers, rttMs, blockFlops = DEFAULT_BLOCK_FLOPS } = options;
  const byId = new Map(peers.map((p) => [p.peerId, p]));
  const unmeasured = median([...(rttMs?.values() ?? [])]) ?? DEFAULT_RTT_MS;
  const edges: { from: number; to: number; cost: number; hop: RouteHop }[] = [];
  for (const h of model.hosts) {
    const peer = byId.get(h.peerId);
    if (h.state !== 'online' || !peer || avoid.has(h.peerId) || h.layers[0] < from || h.layers[1] >= to) continue;
    const blocks = h.layers[1] - h.layers[0] + 1;
    // GFLOP/s are 1e6 FLOPs per ms
    const computeMs = (blocks * blockFlops) / (Math.max(0.1, peer.capabilities?.gflops ?? DEFAULT_GFLOPS) * 1e6);
    // a host's open sessions share its compute: its blocks take longer the more it serves
    const load = 1 + (h.sessions ?? 0) / SESSIONS_PER_SLOWDOWN;
    const short = h.freeTokens !== undefined && h.freeTokens < tokens ? SHORT_OF_CACHE_HOPS * DEFAULT_RTT_MS : 0;
    const cost = (rttMs?.get(h.peerId) ?? unmeasured) + HOP_OVERHEAD_MS + computeMs * load + short;
    edges.push({ from: h.layers[0], to: h.layers[1] + 1, cost, hop: { peerId: h.peerId, addrs: peer.addrs, layers: h.layers } });
  }
  edges.sort((a, b) => a.from - b.from);
  const best = new Map<number, number>([[from, 0]]);
  const via = new Map<number, { at: number; hop: RouteHop }>();
  for (const e of edges) {
    const here = best.get(e.from);
    if (here === undefined) continue;
    if (here + e.cost < (best.get(e.to) ?? Number.POSITIVE_INFINITY)) {
      best.set(e.to, here + e.cost);
      via.set(e.to, { at: e.from, hop: e.hop });
    }
  }
  if (!best.has(to)) return null;
  const route: RouteHop[] = [];
  for (let at = to; at > from; at = via.get(at)!.at) route.unshift(via.get(at)!.hop);
  return route;
}

/** A user's round trip to a host is measured again after this long. */
export const RTT_TTL_MS = 30_000;
/** Hosts pinged at once, and at most per route (the rest are predicted from their coordinates, or count the median). */
const PING_CONCURRENCY = 16;
export const MAX_PINGS = 64;
/** Hosts with coordinates pinged first, to fit this node's own coordinate (the ones surest of theirs). */
export const FIT_PINGS = 16;
/** Measurements to hosts with coordinates a prediction needs. */
const MIN_FIT = 3;
/** The least error a host's coordinate is taken at when choosing whom to fit to. */
const MIN_TRUSTED_ERROR = 0.05;
/** Round trips measured by each user node: host → { ms, at }. */
const measured = new WeakMap<Libp2p, Map<string, { ms: number; at: number }>>();

/**
 * The hosts to ping next, in order, of those not yet `measured`: with fewer than FIT_PINGS measured to hosts with
 * coordinates, the hosts surest of their coordinates (to fit this node's); then the most promising first by the
 * coordinates' predicted round trip from `own` (by `rank` of it: default the round trip itself), and hosts without a
 * coordinate after, in the order given. At most `limit`.
 */
export function pingOrder(
  hosts: readonly PeerRecord[], measured: ReadonlyMap<string, number>, own: Coordinate | null, limit: number,
  rank: (host: PeerRecord, rttMs: number) => number = (_, rtt) => rtt,
): PeerRecord[] {
  const left = hosts.filter((h) => !measured.has(h.peerId));
  const fitted = hosts.filter((h) => h.coordinate && measured.has(h.peerId)).length;
  const withCoordinate = left.filter((h) => h.coordinate);
  const without = left.filter((h) => !h.coordinate);
  if (own === null) {
    // a host's own word on its error, floored: announcing 0 buys no place ahead of the honest ones
    const err = (h: PeerRecord) => Math.max(MIN_TRUSTED_ERROR, h.coordinate!.error);
    const surest = [...withCoordinate].sort((a, b) => err(a) - err(b) || (a.peerId < b.peerId ? -1 : 1));
    return [...surest.slice(0, Math.max(0, FIT_PINGS - fitted)), ...without].slice(0, limit);
  }
  const score = new Map(withCoordinate.map((h) => [h.peerId, rank(h, estimateRttMs(own, h.coordinate!))]));
  const nearest = [...withCoordinate].sort((a, b) => score.get(a.peerId)! - score.get(b.peerId)!);
  return [...nearest, ...without].slice(0, limit);
}

/** This node's coordinate fitted from its round trips to hosts with coordinates, or null with fewer than MIN_FIT. */
export function ownCoordinate(
  hosts: readonly PeerRecord[], measured: ReadonlyMap<string, number>, random?: () => number,
): Coordinate | null {
  const samples = hosts.flatMap((h) => {
    const rttMs = measured.get(h.peerId);
    return h.coordinate && rttMs !== undefined ? [{ coordinate: h.coordinate, rttMs }] : [];
  });
  return samples.length < MIN_FIT ? null : fitCoordinate(samples, 20, random);
}

/**
 * The round trips a route is planned with: every host measured, and every other host with a coordinate predicted from
 * this node's own (a host with neither counts the median, in routeOver).
 */
export function plannedRtts(
  hosts: readonly PeerRecord[], measured: ReadonlyMap<string, number>, own: Coordinate | null,
): Map<string, number> {
  const out = new Map(measured);
  if (own) for (const h of hosts) if (!out.has(h.peerId) && h.coordinate) out.set(h.peerId, estimateRttMs(own, h.coordinate));
  return out;
}

/**
 * This node's round trips to `hosts`, in ms, for routing: those measured within RTT_TTL_MS from before, up to
 * MAX_PINGS more pinged now (PING_CONCURRENCY at a time, all within `budgetMs`) in pingOrder (first the hosts surest of
 * their coordinates, to fit this node's own; then the nearest by the coordinates), and every other host predicted
 * from the coordinates. A host that does not answer is left out (it is predicted or counts the median, and one that
 * is down fails when the session dials it, and is routed around).
 */
export async function hostRoundTrips(
  node: Libp2p, hosts: readonly PeerRecord[], budgetMs = 1_000, rank?: (host: PeerRecord, rttMs: number) => number,
): Promise<Map<string, number>> {
  const until = performance.now() + budgetMs;
  // first the hosts that fit this node's coordinate, then the nearest by it, MAX_PINGS in all
  const fitting = pingOrder(hosts, freshRtts(node, hosts), null, FIT_PINGS);
  await pingHosts(node, fitting, until);
  let known = freshRtts(node, hosts);
  // (a host of the first round that did not answer is not tried again)
  const tried = new Set(fitting.map((h) => h.peerId));
  const untried = hosts.filter((h) => !tried.has(h.peerId));
  await pingHosts(node, pingOrder(untried, known, ownCoordinate(hosts, known), MAX_PINGS - fitting.length, rank), until);
  known = freshRtts(node, hosts);
  return plannedRtts(hosts, known, ownCoordinate(hosts, known));
}

/**
 * How promising a host is for a route, from its predicted round trip: what a hop through it costs per block it holds
 * (its round trip and HOP_OVERHEAD_MS shared by its blocks, plus a block's compute at its speed), as routeOver counts.
 */
export function hopRank(model: HostedModelEntry, blockFlops = DEFAULT_BLOCK_FLOPS): (host: PeerRecord, rttMs: number) => number {
  const blocks = new Map(model.hosts.map((h) => [h.peerId, h.layers[1] - h.layers[0] + 1]));
  return (host, rttMs) => {
    const n = blocks.get(host.peerId) ?? 1;
    return (rttMs + HOP_OVERHEAD_MS) / n + blockFlops / (Math.max(0.1, host.capabilities?.gflops ?? DEFAULT_GFLOPS) * 1e6);
  };
}

/** Rounds of confirming a route's predicted hops (each pings them and routes again). */
export const CONFIRM_ROUNDS = 2;

/** The hosts of a route whose round trips were predicted, not measured: what to ping before trusting it. */
export function unconfirmedHops(route: readonly RouteHop[], measured: ReadonlyMap<string, number>): string[] {
  return [...new Set(route.map((h) => h.peerId).filter((id) => !measured.has(id)))];
}

/**
 * routeOver by this node's round trips (hostRoundTrips), then, while hops of the route were only predicted from
 * coordinates, those hops pinged and the route made again (at most CONFIRM_ROUNDS times): a prediction that was too
 * kind loses its host the route, one that was right keeps it.
 */
export async function measuredRoute(
  node: Libp2p, model: HostedModelEntry, peers: readonly PeerRecord[], hosts: readonly PeerRecord[], options: RouteOptions,
  budgetMs = 1_000,
): Promise<RouteHop[] | null> {
  const until = performance.now() + budgetMs;
  await hostRoundTrips(node, hosts, budgetMs, hopRank(model, options.blockFlops));
  let r = routeByRtts(model, peers, hosts, options, freshRtts(node, hosts));
  for (let round = 0; r.unconfirmed.length > 0 && round < CONFIRM_ROUNDS; round++) {
    const unconfirmed = new Set(r.unconfirmed);
    await pingHosts(node, hosts.filter((h) => unconfirmed.has(h.peerId)), until);
    r = routeByRtts(model, peers, hosts, options, freshRtts(node, hosts));
  }
  // a hop still only predicted (its host did not answer in time) keeps no prediction: it counts as an unmeasured host
  if (r.unconfirmed.length > 0) r = routeByRtts(model, peers, hosts, options, freshRtts(node, hosts), r.unconfirmed);
  return r.route;
}

/**
 * routeOver by the round trips measured to `hosts` and those predicted for the rest (plannedRtts; `distrusted` hosts
 * keep no prediction), and the route's hops that were only predicted: one round of measuredRoute, which the simulation
 * (src/sim/hosted.ts) runs too.
 */
export function routeByRtts(
  model: HostedModelEntry, peers: readonly PeerRecord[], hosts: readonly PeerRecord[], options: RouteOptions,
  measured: ReadonlyMap<string, number>, distrusted: readonly string[] = [], random?: () => number,
): { route: RouteHop[] | null; unconfirmed: string[] } {
  const rttMs = plannedRtts(hosts, measured, ownCoordinate(hosts, measured, random));
  for (const id of distrusted) if (!measured.has(id)) rttMs.delete(id);
  const route = routeOver(model, peers, { ...options, rttMs });
  return { route, unconfirmed: route ? unconfirmedHops(route, measured) : [] };
}

/** This node's round trips to `hosts` measured within RTT_TTL_MS. */
function freshRtts(node: Libp2p, hosts: readonly PeerRecord[]): Map<string, number> {
  const cache = measured.get(node);
  const out = new Map<string, number>();
  const since = Date.now() - RTT_TTL_MS;
  for (const h of hosts) {
    const m = cache?.get(h.peerId);
    if (m && m.at >= since) out.set(h.peerId, m.ms);
  }
  return out;
}

/** Pings `hosts`, PING_CONCURRENCY at a time, until `until` (performance.now()); what answers is kept in the cache. */
async function pingHosts(node: Libp2p, hosts: readonly PeerRecord[], until: number): Promise<void> {
  let cache = measured.get(node);
  if (!cache) measured.set(node, (cache = new Map()));
  let next = 0;
  const lane = async () => {
    while (next < hosts.length) {
      const h = hosts[next++];
      const left = until - performance.now();
      if (left <= 0) return;
      try {
        cache.set(h.peerId, { ms: await roundTrip(node, { peerId: h.peerId, addrs: h.addrs }, { timeoutMs: left }), at: Date.now() });
      } catch {
        // no answer in time: not measured
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(PING_CONCURRENCY, hosts.length) }, lane));
}
