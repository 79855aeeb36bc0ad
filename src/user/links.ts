import type { Libp2p } from '@libp2p/interface';
import { type PeerRecord, probe, type Proximity } from '../p2p/index.ts';
import type { LinkMeasurement } from '../plan/index.ts';

/**
 * The links a plan is made over: what the workers measured between themselves (announced in
 * their records' `proximity`) and what this user measures to each of them with its own probes.
 */

/**
 * A worker's measurement is used while it is this young. Workers re-measure every 10 s
 * (PROBE_INTERVAL_MS) and fold in their jobs' transfers; an entry older than six rounds is one
 * whose probes keep failing (the peer moved or its link broke), and a guess is then better.
 */
export const LINK_MAX_AGE_MS = 60_000;
/** The user's probe of a worker is reused for this long: plans made between steps do not probe again each step. */
export const USER_PROBE_TTL_MS = 30_000;
/**
 * The user's probes before a plan take at most this long together (a probe is a few round trips
 * and 256 KiB: milliseconds on a LAN, a fraction of a second at 10 Mbit/s); the workers not
 * probed by then are planned with the default link (or their last probe, if not too old).
 */
export const USER_PROBE_BUDGET_MS = 5_000;

/**
 * Worker → worker links from the workers' records (only among `workers`, only fresh entries):
 * each worker's probes of the others, and what the others' transfers to it achieved (its
 * entries' `inbound`); of the two measurements of a direction, the later counts.
 */
export function workerLinks(workers: readonly PeerRecord[], now = Date.now()): LinkMeasurement[] {
  const ids = new Set(workers.map((w) => w.peerId));
  const fresh = (at: number) => now - at <= LINK_MAX_AGE_MS;
  return workers.flatMap((w) => Object.entries(w.proximity)
    .filter(([peer]) => ids.has(peer) && peer !== w.peerId)
    .flatMap(([peer, p]) => {
      const out: LinkMeasurement[] = [];
      if (fresh(p.measuredAt)) out.push({ from: w.peerId, to: peer, rttMs: p.rttMs, mbps: p.mbps, at: p.measuredAt });
      const back = p.inbound;
      if (back && fresh(back.measuredAt)) out.push({ from: peer, to: w.peerId, rttMs: p.rttMs, mbps: back.mbps, at: back.measuredAt });
      return out;
    }));
}

/** This user's last probe of each worker, per user node. */
const probed = new WeakMap<Libp2p, Map<string, Proximity>>();

/**
 * User → worker links, probed by this node (the way back is taken to be the same: see
 * `linkBetween`). The probes run one after the other, not at once: a probe's bandwidth is
 * that of one transfer, and several at once would share the user's uplink and each read a
 * fraction of it. A worker probed within USER_PROBE_TTL_MS is not probed again; the whole
 * round stops at `budgetMs`; a worker that cannot be probed is left out (its links take the
 * planner's defaults).
 */
export async function userLinks(node: Libp2p, workers: readonly PeerRecord[], budgetMs = USER_PROBE_BUDGET_MS): Promise<LinkMeasurement[]> {
  let cache = probed.get(node);
  if (!cache) probed.set(node, (cache = new Map()));
  const me = node.peerId.toString();
  const until = performance.now() + budgetMs;
  const out: LinkMeasurement[] = [];
  for (const w of workers) {
    let p = cache.get(w.peerId);
    const left = until - performance.now();
    if ((!p || Date.now() - p.measuredAt > USER_PROBE_TTL_MS) && left > 0) {
      try {
        p = await probe(node, { peerId: w.peerId, addrs: w.addrs }, { timeoutMs: left });
        cache.set(w.peerId, p);
      } catch {
        // unreachable for a probe now: an older probe still counts while it is young enough
      }
    }
    if (p && Date.now() - p.measuredAt <= LINK_MAX_AGE_MS) {
      out.push({ from: me, to: w.peerId, rttMs: p.rttMs, mbps: p.mbps, at: p.measuredAt });
    }
  }
  return out;
}

/**
 * Every link a plan over `workers` may use: theirs to each other, and this user's to them.
 * @example
 * const links = measuredLinks(linkTable(await gatherLinks(node, workers)))
 */
export async function gatherLinks(node: Libp2p, workers: readonly PeerRecord[], budgetMs?: number): Promise<LinkMeasurement[]> {
  return [...workerLinks(workers), ...(await userLinks(node, workers, budgetMs))];
}
