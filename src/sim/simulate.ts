/**
 * `simulateSwarm(options)` (`npm run simulate`): a swarm of thousands of peers over hours of virtual time, in one
 * process, running the project's own registry, model index, router, planner, placement, sampling, reputation, ledger
 * and reward arithmetic; only the network (world.ts) and the compute (each device's speed) are simulated.
 */
import { createLogger, type HostedModelEntry, mergeModelEntries, type PeerRecord, tierOf } from '../p2p/index.ts';
import { Registry } from '../validator/registry.ts';
import { modelIndex } from '../validator/hosted-models.ts';
import { Reputation } from '../verify/reputation.ts';
import { VirtualClock } from './clock.ts';
import type { SimContext, SimModel } from './context.ts';
import { type Economy, settle } from './economy.ts';
import { placeHost, runSession, type SessionOutcome, type Spans, unplaceHost } from './hosted.ts';
import { CHURN_SHAPE, makePeers, makeUsers, type SimPeer } from './population.ts';
import { Random } from './random.ts';
import { jobLayers, type JobOutcome, runJob } from './training.ts';
import { validatorRelay } from './world.ts';
import { coordinateError, probeFor } from './coordinates.ts';

export interface SimulateOptions {
  peers: number;
  hours: number;
  seed?: number;
  /** Median time a peer stays online (hours, default 1); it sleeps half that (median) before it returns. */
  medianLifetimeHours?: number;
  /** Share of peers that cheat, of every kind alike (default 0.02). */
  cheaterShare?: number;
  /** Share of peers and users behind a NAT nothing punches through (default 0.12). */
  relayedShare?: number;
  /** Sessions a virtual hour (default twice the peers), and private training jobs (default peers / 500). */
  sessionsPerHour?: number;
  jobsPerHour?: number;
  /** Steps of each training job (default 20). */
  jobSteps?: number;
  /** Share of sessions whose best route is also computed, with every host's true round trip (default 0.1). */
  routeSample?: number;
  /** Told every virtual minute. */
  onProgress?: (virtualMs: number, wallMs: number) => void;
}

/** The scenario's hosted models: 8 to 80 blocks (about 0.4B to 70B parameters), the small ones asked for more. */
export const SIM_MODELS: readonly SimModel[] = [
  { name: 'tiny-8', hash: 'a1'.repeat(32), blocks: 8, blockParams: 25e6, weight: 0.4 },
  { name: 'mid-24', hash: 'b2'.repeat(32), blocks: 24, blockParams: 120e6, weight: 0.3 },
  { name: 'big-48', hash: 'c3'.repeat(32), blocks: 48, blockParams: 270e6, weight: 0.2 },
  { name: 'huge-80', hash: 'd4'.repeat(32), blocks: 80, blockParams: 860e6, weight: 0.1 },
];

/** The validator's view is refreshed this often (workers announce every 2 s; the registry forgets one after 10 s). */
const REFRESH_MS = 5_000;
const ANNOUNCE_MS = 2_000;
/**
 * How long the peers online at the start have probed before it: their coordinates' history, as their lives' (each
 * peer's life runs 24 hours before the start). From the origin, at the workers' rate, the median relative error of the
 * round trips predicted between 6,500 online peers is 0.25 after 1 minute, 0.14 after 2, 0.026 after 5 and 0.024 after
 * 10 (pairs under 30 ms: 4.6, 1.8, 0.10, 0.09); the swarm of #50 routed 95.3% of sessions within 10% of the best
 * route from a cold start, its first minutes the worst.
 */
const COORDINATE_HISTORY_MS = 10 * 60_000;
/** Time series are sampled this often. */
const SERIES_MS = 60_000;
const PROMPT_TOKENS = 64;
const NEW_TOKENS = 128;

export interface SimulationReport {
  peers: number;
  virtualHours: number;
  wallSeconds: number;
  events: number;
  sessions: number;
  sessionsCompleted: number;
  sessionsFailed: Record<string, number>;
  /** Sessions still running when the simulation ended (neither completed nor failed). */
  sessionsUnfinished: number;
  /** Completed sessions a cheater computed part of before it was caught. */
  sessionsTainted: number;
  completionRate: number;
  tokensPerSecond: { median: number; p99: number };
  reroutes: number;
  /** The chosen route's step time over the best route's, on the sampled sessions. */
  routeLatencyRatio: { sampled: number; median: number; p90: number; max: number; withinTenPercent: number };
  /**
   * The median relative error of round trips predicted from the coordinates (plan/vivaldi.ts) between online peers, at
   * the start (after their history) and at the end.
   */
  coordinateError: { start: number; end: number };
  jobs: number;
  jobsCompleted: number;
  jobsFailed: Record<string, number>;
  jobsUnfinished: number;
  failovers: number;
  placementMs: { median: number; max: number; devicesMax: number };
  /** Each virtual minute, per model: the share of its blocks with a host, and the hosts of its least-held block. */
  coverage: { minute: number; models: Record<string, number>; leastHosts: Record<string, number> }[];
  /** Cheaters that did work (a cheater given none had nothing to cheat on), and those caught. */
  cheaters: number;
  cheatersCaught: number;
  minutesToCatch: { median: number; max: number } | null;
  honestFlagged: number;
  economy: Economy;
  validatorRequestsPerSecond: number;
  /** Per virtual minute: sessions completed and failed, and cheaters caught, in that minute; peers online at its end. */
  series: { minute: number; completed: number; failed: number; caught: number; online: number }[];
  scenario: Record<string, unknown>;
}

const quantile = (xs: number[], q: number) => {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
};

export function simulateSwarm(options: SimulateOptions): SimulationReport {
  const wall0 = performance.now();
  const seed = options.seed ?? 1;
  const hourMs = 3_600_000;
  const endMs = options.hours * hourMs;
  const medianOnlineMs = (options.medianLifetimeHours ?? 1) * hourMs;
  const medianOfflineMs = medianOnlineMs / 2;
  const relayedShare = options.relayedShare ?? 0.12;
  const sessionsPerHour = options.sessionsPerHour ?? options.peers * 2;
  const jobsPerHour = options.jobsPerHour ?? options.peers / 500;
  const jobSteps = options.jobSteps ?? 20;
  const routeSample = options.routeSample ?? 0.1;
  const clock = new VirtualClock();
  const rng = {
    churn: new Random(seed), sessions: new Random(seed + 1), checks: new Random(seed + 2), jobs: new Random(seed + 3),
    hosts: new Random(seed + 4), probes: new Random(seed + 7),
  };
  const peers = makePeers(new Random(seed + 5), {
    peers: options.peers, medianOnlineMs, medianOfflineMs, cheaterShare: options.cheaterShare ?? 0.02, relayedShare,
  });
  const users = makeUsers(new Random(seed + 6), Math.max(10, Math.round(options.peers / 20)), relayedShare);
  const spans: Spans = SIM_MODELS.map(() => new Map());
  const flaggedSinceRefresh = new Set<string>();
  const ctx: SimContext = {
    clock, rng, peers, byId: new Map(peers.map((p) => [p.id, p])), users, models: [...SIM_MODELS],
    relay: validatorRelay(),
    reputation: new Reputation(),
    view: { live: [], models: new Map() },
    work: [], requests: {}, catches: [], honestFlagged: [], skippedFlops: new Map(),
    flag(p: SimPeer, reason: string) {
      if (p.excluded) return;
      ctx.reputation.check(p.id, false, reason);
      p.excluded = true;
      p.caughtAt = clock.now();
      flaggedSinceRefresh.add(p.id);
      if (p.cheat !== null) ctx.catches.push({ peer: p.id, kind: p.cheat, at: clock.now(), afterMs: clock.now() - (p.joinedAt ?? 0) });
      else ctx.honestFlagged.push(p.id);
      unplaceHost(spans, p);
    },
  };

  // hosts online at the start take their spans in a shuffled order; then every peer's life goes on
  const shuffled = peers.filter((p) => p.online && p.hosts).map((p) => ({ p, k: rng.hosts.next() })).sort((a, b) => a.k - b.k);
  for (const { p } of shuffled) placeHost(ctx, spans, p);
  const toggle = (p: SimPeer) => {
    if (p.online) {
      p.online = false;
      unplaceHost(spans, p);
      p.nextChange = clock.now() + rng.churn.weibull(CHURN_SHAPE, medianOfflineMs);
    } else {
      p.online = true;
      p.joinedAt ??= clock.now();
      if (p.hosts && !p.excluded) placeHost(ctx, spans, p);
      p.nextChange = clock.now() + rng.churn.weibull(CHURN_SHAPE, medianOnlineMs);
    }
    clock.at(p.nextChange, () => toggle(p));
  };
  for (const p of peers) clock.at(p.nextChange, () => toggle(p));

  // the validator: every online peer's announcement, its live records (with reputation's exclusions) and model index
  const registry = new Registry(createLogger({ level: 'error' }), () => {}, () => clock.now());
  const announce = (p: SimPeer) => {
    const span = p.span ? SIM_MODELS[p.span.model] : null;
    const backend = p.device.name.endsWith('gpu') ? 'webgpu' : 'ort';
    const capabilities = { memoryBytes: p.device.memoryBytes, gflops: p.device.gflops, tier: tierOf(p.device.gflops), cores: 8, backend };
    const layers: [number, number] | null = p.span ? [p.span.start, p.span.end - 1] : null;
    registry.record(p.id, {
      roles: ['worker'], capabilities, addrs: [`/sim/${p.id}`], proximity: {}, at: clock.now(), coordinate: p.coordinate,
      ...(span && layers ? { hosts: [{ ...span, layers, format: 'bf16', state: 'online', sessions: p.sessions }] } : {}),
    });
  };
  // the swarm starts in its steady state (its peers' lives began a day before), its coordinates too: those online at
  // the start have probed for COORDINATE_HISTORY_MS (a peer that first comes later starts at the origin, as a worker
  // does; one that sleeps and returns keeps its coordinate, as a machine's sleep keeps the worker's memory)
  const atStart = peers.filter((p) => p.online);
  for (let t = 0; t < COORDINATE_HISTORY_MS; t += REFRESH_MS) probeFor(atStart, REFRESH_MS, ctx.relay, rng.probes);
  const coordinatesAtStart = coordinateError(atStart, ctx.relay, new Random(seed + 8));
  const refresh = () => {
    // each online peer probes others at a worker's rate, and moves its coordinate by their round trips
    const online = peers.filter((p) => p.online);
    probeFor(online, REFRESH_MS, ctx.relay, rng.probes);
    for (const p of online) announce(p);
    ctx.requests.announce = (ctx.requests.announce ?? 0) + (peers.filter((p) => p.online).length * REFRESH_MS) / ANNOUNCE_MS;
    const live: PeerRecord[] = registry.live().map((r) => (ctx.byId.get(r.peerId)?.excluded ? { ...r, excluded: true } : r));
    const entries: HostedModelEntry[] = [];
    for (let cursor: number | undefined = 0; cursor !== undefined;) {
      const page = modelIndex(live, cursor);
      entries.push(...page.models);
      cursor = page.next;
    }
    const models = new Map(mergeModelEntries(entries).map((m) => [m.name, m]));
    ctx.view = { live: live.filter((r) => !r.excluded), models };
    flaggedSinceRefresh.clear();
    clock.after(REFRESH_MS, refresh);
  };
  refresh();

  // sessions and jobs arrive as Poisson processes
  const outcomes: SessionOutcome[] = [];
  let started = 0;
  const nextSession = () => {
    clock.after(rng.sessions.exponential(hourMs / sessionsPerHour), () => {
      started++;
      ctx.requests.models = (ctx.requests.models ?? 0) + 1;
      const user = users[rng.sessions.below(users.length)];
      const model = SIM_MODELS.indexOf(rng.sessions.pick(SIM_MODELS));
      runSession(ctx, user, model, PROMPT_TOKENS, NEW_TOKENS, rng.sessions.next() < routeSample, (o) => outcomes.push(o));
      nextSession();
    });
  };
  if (sessionsPerHour > 0) nextSession();
  const jobs: JobOutcome[] = [];
  const placements: { ms: number; devices: number }[] = [];
  let jobsStarted = 0;
  const nextJob = () => {
    clock.after(rng.jobs.exponential(hourMs / jobsPerHour), () => {
      jobsStarted++;
      ctx.requests.status = (ctx.requests.status ?? 0) + 1;
      runJob(ctx, users[rng.jobs.below(users.length)], jobSteps, (o) => jobs.push(o), (p) => placements.push(p));
      nextJob();
    });
  };
  jobLayers();
  if (jobsPerHour > 0) nextJob();

  // time series: coverage of each model, sessions and catches per window
  const coverage: SimulationReport['coverage'] = [];
  const series: SimulationReport['series'] = [];
  let seen = { completed: 0, failed: 0, caught: 0 };
  const sample = () => {
    const models: Record<string, number> = {};
    const leastHosts: Record<string, number> = {};
    SIM_MODELS.forEach((m, i) => {
      const hosts = new Array<number>(m.blocks).fill(0);
      for (const s of spans[i].values()) for (let b = s.start; b < s.end; b++) hosts[b]++;
      models[m.name] = hosts.filter((n) => n > 0).length / m.blocks;
      leastHosts[m.name] = Math.min(...hosts);
    });
    const minute = clock.now() / 60_000;
    coverage.push({ minute, models, leastHosts });
    const completed = outcomes.filter((o) => o.ok).length;
    const failed = outcomes.length - completed;
    const online = peers.filter((p) => p.online).length;
    const caught = ctx.catches.length - seen.caught;
    series.push({ minute, completed: completed - seen.completed, failed: failed - seen.failed, caught, online });
    seen = { completed, failed, caught: ctx.catches.length };
  };
  for (let t = 0; t <= endMs; t += SERIES_MS) clock.at(t, sample);
  for (let t = 60_000; t < endMs; t += 60_000) clock.at(t, () => options.onProgress?.(clock.now(), performance.now() - wall0));
  clock.run(endMs);

  const completed = outcomes.filter((o) => o.ok);
  const sessionsFailed: Record<string, number> = {};
  for (const o of outcomes) if (!o.ok) sessionsFailed[o.cause!] = (sessionsFailed[o.cause!] ?? 0) + 1;
  const jobsFailed: Record<string, number> = {};
  for (const j of jobs) if (!j.ok) jobsFailed[j.cause!] = (jobsFailed[j.cause!] ?? 0) + 1;
  const ratios = outcomes.flatMap((o) => (o.routeRatio === undefined ? [] : [o.routeRatio]));
  const catchMinutes = ctx.catches.map((c) => c.afterMs / 60_000);
  const economy = settle(ctx, options.hours);
  const requests = Object.values(ctx.requests).reduce((a, b) => a + b, 0);
  return {
    peers: options.peers,
    virtualHours: options.hours,
    wallSeconds: (performance.now() - wall0) / 1000,
    events: clock.ran,
    sessions: started,
    sessionsCompleted: completed.length,
    sessionsFailed,
    sessionsUnfinished: started - outcomes.length,
    sessionsTainted: completed.filter((o) => o.tainted).length,
    completionRate: outcomes.length ? completed.length / outcomes.length : 0,
    tokensPerSecond: {
      median: quantile(completed.map((o) => o.tokens / (o.decodeMs / 1000)), 0.5),
      p99: quantile(completed.map((o) => o.tokens / (o.decodeMs / 1000)), 0.99),
    },
    reroutes: outcomes.reduce((a, o) => a + o.reroutes, 0),
    routeLatencyRatio: {
      sampled: ratios.length, median: quantile(ratios, 0.5), p90: quantile(ratios, 0.9), max: Math.max(1, ...ratios),
      withinTenPercent: ratios.length ? ratios.filter((r) => r <= 1.1).length / ratios.length : 1,
    },
    coordinateError: { start: coordinatesAtStart, end: coordinateError(peers.filter((p) => p.online), ctx.relay, new Random(seed + 9)) },
    jobs: jobsStarted,
    jobsUnfinished: jobsStarted - jobs.length,
    jobsCompleted: jobs.filter((j) => j.ok).length,
    jobsFailed,
    failovers: jobs.reduce((a, j) => a + j.failovers, 0),
    placementMs: {
      median: quantile(placements.map((p) => p.ms), 0.5), max: Math.max(0, ...placements.map((p) => p.ms)),
      devicesMax: Math.max(0, ...placements.map((p) => p.devices)),
    },
    coverage,
    cheaters: ctx.skippedFlops.size,
    cheatersCaught: ctx.catches.length,
    minutesToCatch: catchMinutes.length ? { median: quantile(catchMinutes, 0.5), max: Math.max(...catchMinutes) } : null,
    honestFlagged: ctx.honestFlagged.length,
    economy,
    validatorRequestsPerSecond: requests / (endMs / 1000),
    series,
    scenario: {
      seed, medianLifetimeHours: medianOnlineMs / hourMs, churn: `Weibull, shape ${CHURN_SHAPE}`, relayedShare, sessionsPerHour, jobsPerHour, jobSteps,
      users: users.length, models: SIM_MODELS.map((m) => `${m.name} (${m.blocks} blocks)`),
    },
  };
}
