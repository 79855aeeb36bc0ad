import type { Libp2p } from '@libp2p/interface';
import { type HostedModelEntry, type PeerRecord, roundTrip } from '../p2p/index.ts';
import type { RouteHop } from './hosted-session.ts';
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
/** Hosts pinged at once, and at most per route (the rest count DEFAULT_RTT_MS until measured). */
const PING_CONCURRENCY = 16;
const MAX_PINGS = 64;
/** Round trips measured by each user node: host → { ms, at }. */
const measured = new WeakMap<Libp2p, Map<string, { ms: number; at: number }>>();

/**
 * This node's round trips to `hosts`, in ms: those measured within RTT_TTL_MS from before, and up to MAX_PINGS more
 * pinged now (PING_CONCURRENCY at a time, all within `budgetMs`). A host that does not answer is left out (it counts
 * DEFAULT_RTT_MS, and one that is down fails when the session dials it, and is routed around).
 */
export async function hostRoundTrips(node: Libp2p, hosts: readonly PeerRecord[], budgetMs = 1_000): Promise<Map<string, number>> {
  let cache = measured.get(node);
  if (!cache) measured.set(node, (cache = new Map()));
  const now = Date.now();
  const stale = hosts.filter((h) => (cache.get(h.peerId)?.at ?? 0) < now - RTT_TTL_MS).slice(0, MAX_PINGS);
  const until = performance.now() + budgetMs;
  let next = 0;
  const lane = async () => {
    while (next < stale.length) {
      const h = stale[next++];
      const left = until - performance.now();
      if (left <= 0) return;
      try {
        cache.set(h.peerId, { ms: await roundTrip(node, { peerId: h.peerId, addrs: h.addrs }, { timeoutMs: left }), at: Date.now() });
      } catch {
        // no answer in time: not measured
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(PING_CONCURRENCY, stale.length) }, lane));
  const out = new Map<string, number>();
  for (const h of hosts) {
    const m = cache.get(h.peerId);
    if (m && m.at >= now - RTT_TTL_MS) out.set(h.peerId, m.ms);
  }
  return out;
}
