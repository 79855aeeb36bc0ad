/**
 * The simulated peers and users. Each peer has a place, a device, and a life: online for a while, asleep for a while,
 * back again (the same peer, its hosted span gone), drawn from heavy-tailed distributions. Peer-to-peer measurements
 * found session lengths heavy-tailed, not exponential: Stutzbach and Rejaie ("Understanding Churn in Peer-to-Peer
 * Networks", IMC 2006) fit Gnutella's, Kad's and BitTorrent's with Weibull distributions of shape 0.34–0.59, and
 * volunteer computing's availability intervals are fit by Weibull too (Javadi et al., "Mining for Statistical Models of
 * Availability in Large-Scale Distributed Systems", MASCOTS 2009). So both times here are Weibull of shape 0.5: many
 * short stays and a few very long ones, with the median the scenario sets.
 */
import { CHEAT_KINDS } from '../worker/fault.ts';
import { type Coordinate, origin } from '../plan/index.ts';
import type { Random } from './random.ts';
import { DEVICE_TIERS, type DeviceTier, drawPlace, type Place } from './world.ts';

/** The Weibull shape of online and offline times. */
export const CHURN_SHAPE = 0.5;

/** What a cheater does (worker/fault.ts's kinds that a check can see, and a host's substitute weights). */
export const SIM_CHEATS = [...CHEAT_KINDS, 'substitute:int4', 'substitute:other'] as const;
export type SimCheat = (typeof SIM_CHEATS)[number];

export interface SimPeer {
  id: string;
  place: Place;
  device: DeviceTier;
  /** Runs `worker --host auto`: serves blocks of a hosted model while online. */
  hosts: boolean;
  cheat: SimCheat | null;
  online: boolean;
  /** When it next goes offline (online) or comes back (offline). */
  nextChange: number;
  /** When it first joined (its cheating starts then). */
  joinedAt: number | null;
  /** Its hosted span while online. */
  span: { model: number; start: number; end: number } | null;
  /** Sessions routed through its span now. */
  sessions: number;
  /** Flagged by a failed check: excluded from plans and routes, its stake slashed once. */
  excluded: boolean;
  caughtAt: number | null;
  /** The private job whose section it holds now, if any. */
  job: number | null;
  /** Its network coordinate, moved by the round trips of its probes (plan/vivaldi.ts). */
  coordinate: Coordinate;
}

export interface PopulationOptions {
  peers: number;
  /** Median online time, ms. */
  medianOnlineMs: number;
  /** Median offline time, ms. */
  medianOfflineMs: number;
  cheaterShare: number;
  relayedShare: number;
}

/** How long each peer's life runs before the simulation starts, so that it starts in the churn's steady state. */
const WARM_UP_MS = 24 * 3_600_000;

/**
 * Peers of the world's mix, each in the state its own life reached by the start: it began WARM_UP_MS before, online or
 * not by the share of time a peer of this churn spends online, and came and went since (a heavy-tailed life is not in
 * its steady state at once: a peer online at a random moment tends to be one of the long stays).
 */
export function makePeers(rng: Random, o: PopulationOptions): SimPeer[] {
  const peers: SimPeer[] = [];
  // Weibull's mean is a fixed multiple of its median for one shape, so the online share is the medians' ratio's
  const onlineShare = o.medianOnlineMs / (o.medianOnlineMs + o.medianOfflineMs);
  for (let i = 0; i < o.peers; i++) {
    const device = rng.pick(DEVICE_TIERS);
    let online = rng.next() < onlineShare;
    let at = -WARM_UP_MS;
    for (;;) {
      at += rng.weibull(CHURN_SHAPE, online ? o.medianOnlineMs : o.medianOfflineMs);
      if (at > 0) break;
      online = !online;
    }
    const cheat = rng.next() < o.cheaterShare ? SIM_CHEATS[rng.below(SIM_CHEATS.length)] : null;
    peers.push({
      id: `sim-${String(i).padStart(5, '0')}`,
      place: drawPlace(rng, o.relayedShare),
      device,
      // two GPUs in three host (the third lends to private jobs), a laptop one time in five; tabs lend to jobs only
      hosts: rng.next() < (device.name.endsWith('gpu') ? 2 / 3 : device.name === 'laptop-cpu' ? 1 / 5 : 0),
      cheat,
      online,
      nextChange: at,
      joinedAt: online ? 0 : null,
      span: null,
      sessions: 0,
      excluded: false,
      caughtAt: null,
      job: null,
      coordinate: origin(),
    });
  }
  return peers;
}

/** A user of the swarm: where it is (its round trips to hosts decide its routes). */
export interface SimUser {
  id: string;
  place: Place;
}

export function makeUsers(rng: Random, count: number, relayedShare: number): SimUser[] {
  return Array.from({ length: count }, (_, i) => ({ id: `user-${String(i).padStart(4, '0')}`, place: drawPlace(rng, relayedShare) }));
}
