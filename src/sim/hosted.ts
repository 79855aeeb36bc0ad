/**
 * Hosted models in the simulation: where joining hosts place their blocks (the project's own placement, after Petals),
 * and sessions routed over them by the project's own router, re-routed when a host leaves or is caught, each hop's
 * chunks of positions checked at the default rate.
 */
import type { HostedModelEntry, PeerRecord } from '../p2p/index.ts';
import {
  CONFIRM_ROUNDS, FIT_PINGS, hopRank, MAX_PINGS, ownCoordinate, pingOrder, routeByRtts, routeOver, type RouteOptions,
} from '../user/hosted-routing.ts';
import type { RouteHop } from '../user/hosted-session.ts';
import { DEFAULT_CHUNK_RATE } from '../user/hosted-checks.ts';
import { COMMIT_CHUNK } from '../verify/index.ts';
import { BLOCK_MEMORY_SHARE, blockThroughputs, type PlacedSpan, routableWindow, spanLength, spanThroughput } from '../worker/placement.ts';
import { blockBytes, blockFlops, type SimContext, type SimModel } from './context.ts';
import type { SimPeer, SimUser } from './population.ts';
import { rttMs } from './world.ts';

/** The router's per-hop overhead and load rule (user/hosted-routing.ts), applied to the true times as well. */
const HOP_OVERHEAD_MS = 5;
const SESSIONS_PER_SLOWDOWN = 8;
/** Re-routes one session may make (user/hosted-session.ts: MAX_REROUTES). */
const MAX_REROUTES = 4;
/** How long a user waits on a lost host before re-routing (a stage's deadline floor, and a dial). */
const LOSS_DETECT_MS = 2_000;
/** How long the validator takes to answer a sampled chunk's check. */
const CHECK_MS = 5_000;
/** A prompt's positions are prefilled this many times faster than they are decoded one by one (a batch). */
const PREFILL_SPEEDUP = 16;

/** Per model: the spans its hosts hold now, by peer id. */
export type Spans = Map<string, PlacedSpan>[];

/**
 * Where a joining host of `gflops` and `memoryBytes` goes, as `worker --host-auto` chooses (worker/auto-host.ts): the
 * blocks that fit its memory (spanLength), of the models it can hold a block of the one whose weakest block serves the
 * least per unit of its demand (a real host, which knows no demand, takes the weakest), at the window placement picks
 * (worker/placement.ts: routableWindow); its throughput what it pushes through the span (spanThroughput). Null where
 * it holds no block of any model.
 */
export function chooseSpan(
  models: readonly SimModel[], spans: Spans, id: string, gflops: number, memoryBytes: number,
): { model: number; span: PlacedSpan } | null {
  let chosen: { model: number; need: number; length: number } | null = null;
  models.forEach((m, i) => {
    if (blockBytes(m) > BLOCK_MEMORY_SHARE * memoryBytes) return;
    const length = spanLength(memoryBytes, blockBytes(m), m.blocks);
    const weakest = Math.min(...blockThroughputs([...spans[i].values()], m.blocks));
    const need = m.weight / Math.max(weakest, 1e-9);
    if (chosen === null || need > chosen.need) chosen = { model: i, need, length };
  });
  if (chosen === null) return null;
  const { model, length } = chosen;
  const m = models[model];
  const placed = [...spans[model].values()];
  const { start, length: taken } = routableWindow(blockThroughputs(placed, m.blocks), length, placed);
  return { model, span: { peerId: id, start, end: start + taken, throughput: spanThroughput(gflops, taken * blockFlops(m)) } };
}

/** A joining host takes its span (chooseSpan), if any. */
export function placeHost(ctx: SimContext, spans: Spans, p: SimPeer): void {
  const chosen = chooseSpan(ctx.models, spans, p.id, p.device.gflops, p.device.memoryBytes);
  if (chosen === null) return;
  const { model, span } = chosen;
  p.span = { model, start: span.start, end: span.end };
  spans[model].set(p.id, span);
}

export function unplaceHost(spans: Spans, p: SimPeer): void {
  if (p.span) spans[p.span.model].delete(p.id);
  p.span = null;
}

/** The true time of one decoding step over a route, ms: each hop's round trip from the user, overhead and compute. */
function stepMs(ctx: SimContext, user: SimUser, m: SimModel, route: readonly RouteHop[]): number {
  let ms = 0;
  for (const hop of route) {
    const p = ctx.byId.get(hop.peerId)!;
    const blocks = hop.layers[1] - hop.layers[0] + 1;
    const compute = (blocks * blockFlops(m)) / (p.device.gflops * 1e6);
    ms += rttMs(user.place, p.place, ctx.relay) + HOP_OVERHEAD_MS + compute * (1 + p.sessions / SESSIONS_PER_SLOWDOWN);
  }
  return ms;
}

/**
 * The round trips a user routes by, as hostRoundTrips makes them (its pure parts): it pings FIT_PINGS hosts surest of
 * their coordinates, fits its own, pings the nearest by it up to MAX_PINGS, and predicts the rest.
 */
function routeFor(
  ctx: SimContext, user: SimUser, entry: HostedModelEntry, peers: readonly PeerRecord[], options: RouteOptions,
): RouteHop[] | null {
  const online = new Set(entry.hosts.filter((h) => h.state === 'online').map((h) => h.peerId));
  const hosts = ctx.view.live.filter((r) => online.has(r.peerId));
  const random = () => ctx.rng.sessions.next();
  const known = new Map<string, number>();
  const ping = (hs: readonly PeerRecord[]) => {
    for (const h of hs) known.set(h.peerId, rttMs(user.place, ctx.byId.get(h.peerId)!.place, ctx.relay));
  };
  const fitting = pingOrder(hosts, known, null, FIT_PINGS);
  ping(fitting);
  ping(pingOrder(hosts, known, ownCoordinate(hosts, known, random), MAX_PINGS - fitting.length, hopRank(entry, options.blockFlops)));
  // then, as measuredRoute: the route's predicted hops pinged and the route made again
  let r = routeByRtts(entry, peers, hosts, options, known, [], random);
  for (let round = 0; r.unconfirmed.length > 0 && round < CONFIRM_ROUNDS; round++) {
    const unconfirmed = new Set(r.unconfirmed);
    ping(hosts.filter((h) => unconfirmed.has(h.peerId)));
    r = routeByRtts(entry, peers, hosts, options, known, [], random);
  }
  if (r.unconfirmed.length > 0) r = routeByRtts(entry, peers, hosts, options, known, r.unconfirmed, random);
  return r.route;
}

/** Every host's true round trip from the user: what the best route is computed with. */
function allRtts(ctx: SimContext, user: SimUser, entry: HostedModelEntry): Map<string, number> {
  return new Map(entry.hosts.map((h) => [h.peerId, rttMs(user.place, ctx.byId.get(h.peerId)!.place, ctx.relay)]));
}

export interface SessionOutcome {
  ok: boolean;
  cause?: 'no-route' | 'reroutes-exhausted';
  /** A cheater computed part of it (caught later or not). */
  tainted: boolean;
  tokens: number;
  decodeMs: number;
  reroutes: number;
  /** The chosen route's step time against the best route's (sampled sessions only). */
  routeRatio?: number;
}

/**
 * One session: a user's prompt and `newTokens` decoded over a route, hop by hop in virtual time. A host that leaves or
 * is caught mid-session is detected, its blocks re-routed around every host that failed (at most MAX_REROUTES times),
 * and the positions so far replayed on the new hops. Each hop's closed chunks are sampled for checks.
 */
export function runSession(
  ctx: SimContext, user: SimUser, model: number, prompt: number, newTokens: number, compareRoute: boolean,
  done: (o: SessionOutcome) => void,
): void {
  const m = ctx.models[model];
  const entry = ctx.view.models.get(m.name);
  const failed = new Set<string>();
  const peersNow = () => ctx.view.live.filter((r) => !ctx.byId.get(r.peerId)?.excluded);
  const tokens = prompt + newTokens;
  const route0 = entry ? routeFor(ctx, user, entry, peersNow(), { tokens, blockFlops: blockFlops(m) }) : null;
  if (!entry || !route0) return done({ ok: false, cause: 'no-route', tokens: 0, decodeMs: 0, reroutes: 0, tainted: false });
  let route = route0;
  let routeRatio: number | undefined;
  if (compareRoute) {
    const best = routeOver(entry, peersNow(), { tokens: prompt + newTokens, rttMs: allRtts(ctx, user, entry), blockFlops: blockFlops(m) });
    if (best) routeRatio = stepMs(ctx, user, m, route) / stepMs(ctx, user, m, best);
  }
  const began = ctx.clock.now();
  let position = 0;
  let reroutes = 0;
  let finished = false;
  let tainted = false;
  // each hop, while it serves: its sessions count, its positions are checked as their chunks close
  const hold = (r: readonly RouteHop[], by: number) => {
    for (const h of r) ctx.byId.get(h.peerId)!.sessions += by;
  };
  hold(route, 1);
  const finish = (o: Omit<SessionOutcome, 'tainted'>) => {
    if (finished) return;
    finished = true;
    hold(route, -1);
    done({ ...o, tainted });
  };
  // the hops' work is paid and checked in segments: from `from` positions to `to`
  const settle = (r: readonly RouteHop[], from: number, to: number, at: number) => {
    for (const h of r) {
      const p = ctx.byId.get(h.peerId)!;
      const blocks = h.layers[1] - h.layers[0] + 1;
      const flops = (to - from) * blocks * blockFlops(m);
      if (p.cheat !== null && to > from) tainted = true;
      ctx.work.push({ peer: p.id, job: `host_${m.name}`, user: user.id, flops, at });
      const chunks = Math.floor(to / COMMIT_CHUNK) - Math.floor(from / COMMIT_CHUNK);
      checkChunks(ctx, p, chunks, flops, at);
    }
  };
  const run = () => {
    const step = stepMs(ctx, user, m, route);
    const prefill = position === 0 || reroutes > 0 ? step + ((prompt + position) * step) / PREFILL_SPEEDUP : 0;
    const start = ctx.clock.now();
    const endAt = start + prefill + (newTokens - position) * step;
    // the first of its hosts to go before the end
    let lost: { at: number; hop: RouteHop } | null = null;
    for (const hop of route) {
      const p = ctx.byId.get(hop.peerId)!;
      // a host the view still lists may have gone already (the registry forgets it PEER_TTL_MS after its last word)
      const serving = p.online && !p.excluded && p.span?.model === model && p.span.start === hop.layers[0];
      const at = serving ? p.nextChange : start;
      if (at < endAt && (lost === null || at < lost.at)) lost = { at, hop };
    }
    if (lost === null) {
      ctx.clock.at(endAt, () => {
        settle(route, position === 0 ? 0 : prompt + position, prompt + newTokens, endAt);
        finish({ ok: true, tokens: newTokens, decodeMs: endAt - began, reroutes, ...(routeRatio === undefined ? {} : { routeRatio }) });
      });
      return;
    }
    const { hop } = lost;
    ctx.clock.at(lost.at, () => {
      // the positions decoded before the host went
      const done = Math.max(0, Math.min(newTokens - position, Math.floor((lost.at - start - prefill) / step)));
      settle(route, position === 0 ? 0 : prompt + position, prompt + position + done, lost.at);
      position += done;
      failed.add(hop.peerId);
      const failure = (cause: 'no-route' | 'reroutes-exhausted') =>
        finish({ ok: false, cause, tokens: position, decodeMs: ctx.clock.now() - began, reroutes });
      if (++reroutes > MAX_REROUTES) return failure('reroutes-exhausted');
      ctx.clock.after(LOSS_DETECT_MS, () => {
        const sub = routeFor(ctx, user, entry, peersNow(), {
          tokens, avoid: failed, from: hop.layers[0], to: hop.layers[1] + 1, blockFlops: blockFlops(m),
        });
        if (!sub) return failure('no-route');
        hold(route, -1);
        route = route.flatMap((h) => (h === hop ? sub : [h]));
        hold(route, 1);
        run();
      });
    });
  };
  run();
}

/**
 * `chunks` closed chunks of a hop, each checked with probability DEFAULT_CHUNK_RATE (the validator compares its
 * activation commitments). A cheater's first checked chunk fails: it is flagged CHECK_MS later. An honest host's pass.
 */
function checkChunks(ctx: SimContext, p: SimPeer, chunks: number, flops: number, at: number): void {
  let checked = 0;
  let caught = false;
  for (let c = 0; c < chunks; c++) {
    if (ctx.rng.checks.next() >= DEFAULT_CHUNK_RATE) continue;
    checked++;
    if (p.cheat !== null) {
      caught = true;
      break;
    }
  }
  ctx.requests.check = (ctx.requests.check ?? 0) + checked;
  if (p.cheat !== null) ctx.skippedFlops.set(p.id, (ctx.skippedFlops.get(p.id) ?? 0) + flops * SAVED[p.cheat]);
  if (caught) ctx.clock.at(at + CHECK_MS, () => ctx.flag(p, `a checked chunk of its ${p.cheat} computation`));
  else for (let c = 0; c < checked; c++) ctx.reputation.check(p.id, true);
}

/** The share of its compute each kind of cheat saves (what cheating could gain it): none for noise and scaled gradients. */
export const SAVED: Record<string, number> = {
  'noise': 0, 'skip': 1, 'stale': 1, 'scale-grad': 0, 'zero': 1, 'replay': 1, 'free-ride': 1, 'substitute:int4': 0.5, 'substitute:other': 0,
};
