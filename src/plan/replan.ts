import { PlanInfeasibleError } from '../errors.ts';
import { type Hop, stageHops } from './cost.ts';
import { type LinkEstimate, linkBetween, type LinkTable, mbitOf, measuredLinks } from './links.ts';
import { evaluatePlan, plan, stepSeconds } from './partition.ts';
import type { Device, LayerCost, Plan, PlanOptions, StrategyName } from './types.ts';

/**
 * Re-planning between steps or sessions: is a new plan enough faster than the running one,
 * under the devices and links as they are now, to be worth moving sections for, and why?
 */

/**
 * A new plan must predict a step at least this much faster (a share of the running plan's
 * time) to be proposed. Link measurements vary by 10–20% from one probe to the next on a busy
 * machine, and moving a section costs seconds (its weights travel, its sessions are rebuilt):
 * below this a re-plan would chase noise and make plans flap.
 */
export const REPLAN_GAIN = 0.2;
/**
 * ... and at least this many seconds a step. On fast links a small model's predicted step is a
 * few milliseconds, mostly latencies measured to within a millisecond: a 20% gain there is noise,
 * and reloading every section for it costs far more than it could ever save.
 */
export const REPLAN_MIN_SECONDS = 0.01;

/** A link is said to have changed when its bandwidth or round trip moved by this factor or more. */
const LINK_CHANGE = 2;
/** ... and a round trip by this much too: a loaded machine's scheduling moves round trips of a millisecond or two by as much. */
const ROUND_TRIP_CHANGE_MS = 5;
/** ... and the hop's seconds a step by this share of the new plan's gain at least: a change that explains little is not named. */
const LINK_SHARE = 0.1;

/** The swarm as a plan sees it: the devices, and the links measured between them. */
export interface Swarm {
  devices: Device[];
  links: LinkTable;
}

export interface ReplanInput {
  strategy: StrategyName;
  layers: LayerCost[];
  /** The plan running now (its stages' seconds are what it predicted when it was made). */
  current: Plan;
  /** The devices (their memory free now) and links now. */
  now: Swarm;
  /** The swarm the current plan was made on, if kept: the reason can then say what changed. */
  before?: Swarm;
  /** What the plans are made for (tokens, user, traffic); links are taken from `now`. */
  options?: Omit<PlanOptions, 'links'>;
  /** Seconds a step the new plan must save at least (default REPLAN_MIN_SECONDS). */
  minSeconds?: number;
  /** Gain required (default REPLAN_GAIN). */
  gain?: number;
  /** How devices are named in the reason (default: a peer id's last six characters). */
  name?: (id: string) => string;
}

export interface Replan {
  /** Why, and by how much: "worker …a1b2c3 joined: predicted 0.84 s → 0.41 s per step". */
  reason: string;
  plan: Plan;
  /** Predicted seconds per step: the current plan under today's links, and the new plan. */
  current: number;
  proposed: number;
  /** A worker joined or left, or a link changed by LINK_CHANGE, since the plan was made (false: only a better plan over the same swarm). */
  changed: boolean;
}

/**
 * Compares the current plan's predicted step time, timed again over the devices and links of
 * now (a plan whose device is gone takes forever), with the best new plan, and proposes the
 * new one when it is faster by more than `gain`; null otherwise (or when no plan fits). The
 * current plan's sections count as free memory on their devices: moving them frees what they hold.
 * @example
 * const r = replan({ strategy: 'layer-aware', layers, current, now: { devices, links }, options: { tokens: 256, user } })
 * if (r) log(r.reason)   // "link …a1b2c3→…d4e5f6 slowed from 940 to 10 Mbit/s: predicted 0.84 s → 0.41 s per step"
 */
export function replan(input: ReplanInput): Replan | null {
  const { current, now, layers } = input;
  const options: PlanOptions = { ...input.options, links: measuredLinks(now.links) };
  const micro = options.traffic === 'train' ? (options.microBatches ?? 1) : 1;
  const held = new Map<string, number>();
  for (const s of current.stages) held.set(s.device, (held.get(s.device) ?? 0) + s.bytes);
  const devices = now.devices.map((d) => ({ ...d, memoryBytes: d.memoryBytes + (held.get(d.id) ?? 0) }));
  const running = evaluatePlan(current, layers, devices, options);
  let proposed: Plan;
  try {
    proposed = plan(input.strategy, layers, devices, options);
  } catch (err) {
    if (err instanceof PlanInfeasibleError) return null;
    throw err;
  }
  const before = running === null ? Number.POSITIVE_INFINITY : stepSeconds(running, micro);
  const after = stepSeconds(proposed, micro);
  if (!(after < before * (1 - (input.gain ?? REPLAN_GAIN))) || before - after < (input.minSeconds ?? REPLAN_MIN_SECONDS)) return null;
  const name = input.name ?? shortName;
  const causes = [
    ...deviceChanges(current, proposed, now, input.before, name),
    ...(input.before ? linkChanges(current, proposed, layers, options, { now, before: input.before, gain: before - after }, name) : []),
  ];
  const changed = causes.length > 0;
  if (causes.length === 0) causes.push(...costliestLeftOut(current, proposed, layers, options, now, name));
  if (causes.length === 0) causes.push('a faster plan over the same workers');
  return { reason: `${causes.join('; ')}: predicted ${seconds(before)} → ${seconds(after)} per step`, plan: proposed, current: before, proposed: after, changed };
}

/** Workers that left (a stage of the current plan is gone) or joined (in the new plan, not in the swarm before). */
function deviceChanges(current: Plan, proposed: Plan, now: Swarm, before: Swarm | undefined, name: (id: string) => string): string[] {
  const live = new Set(now.devices.map((d) => d.id));
  const out = current.stages.filter((s) => !live.has(s.device)).map((s) => `worker ${name(s.device)} left`);
  const known = new Set((before?.devices ?? []).map((d) => d.id));
  const used = new Set(current.stages.map((s) => s.device));
  for (const s of proposed.stages) {
    if (used.has(s.device)) continue;
    if (before && !known.has(s.device)) out.push(`worker ${name(s.device)} joined`);
    else if (!before) out.push(`worker ${name(s.device)} is free`);
  }
  return out;
}

/** The hops of a plan by link ("from>to"): what crosses each per step (α messages, β bytes). */
function hopsOf(p: Plan, layers: LayerCost[], options: PlanOptions): Map<string, Hop> {
  const out = new Map<string, Hop>();
  p.stages.forEach((s, i) => {
    const next = i + 1 < p.stages.length ? p.stages[i + 1].device : null;
    for (const hop of stageHops(layers, s.start, s.end, s.device, next, i === 0, options)) {
      const key = `${hop.from}>${hop.to}`;
      const seen = out.get(key);
      out.set(key, seen ? { ...hop, alpha: hop.alpha + seen.alpha, beta: hop.beta + seen.beta } : hop);
    }
  });
  return out;
}

/** A hop's seconds per step over a link: α·latency + β/bandwidth. */
const over = (h: Hop, l: LinkEstimate) => h.alpha * l.latency + h.beta / l.bandwidth;

/**
 * What changed on the links that makes the new plan better: links of the current plan that
 * slowed since `before`, links only the new plan takes that sped up; each by LINK_CHANGE or
 * more, and by enough seconds a step to matter (LINK_SHARE of the gain): a fast link measured
 * at 400 Mbit/s, then 800, changed nothing a plan cares about.
 */
function linkChanges(
  current: Plan,
  proposed: Plan,
  layers: LayerCost[],
  options: PlanOptions,
  change: { now: Swarm; before: Swarm; gain: number },
  name: (id: string) => string,
): string[] {
  const out: string[] = [];
  const old = hopsOf(current, layers, options);
  const fresh = hopsOf(proposed, layers, options);
  const what = (h: Hop) => `link ${name(h.from)}→${name(h.to)}`;
  const links = (h: Hop) => [linkBetween(change.before.links, h.from, h.to), linkBetween(change.now.links, h.from, h.to)];
  const matters = (h: Hop, was: LinkEstimate, is: LinkEstimate) => Math.abs(over(h, is) - over(h, was)) >= LINK_SHARE * change.gain;
  for (const h of old.values()) {
    const [was, is] = links(h);
    if (was && is && matters(h, was, is)) out.push(...slowed(what(h), was, is));
  }
  for (const [key, h] of fresh) {
    const [was, is] = links(h);
    if (!old.has(key) && was && is && is.bandwidth >= was.bandwidth * LINK_CHANGE && matters(h, was, is)) {
      out.push(`${what(h)} sped up from ${mbit(was.bandwidth)} to ${mbit(is.bandwidth)} Mbit/s`);
    }
  }
  return out;
}

/** The current plan's costliest hop that the new plan leaves out: the cause when nothing changed (that plan was not the best one). */
function costliestLeftOut(
  current: Plan,
  proposed: Plan,
  layers: LayerCost[],
  options: PlanOptions,
  now: Swarm,
  name: (id: string) => string,
): string[] {
  const fresh = hopsOf(proposed, layers, options);
  let worst: { hop: Hop; link: LinkEstimate; seconds: number } | null = null;
  for (const [key, hop] of hopsOf(current, layers, options)) {
    const link = linkBetween(now.links, hop.from, hop.to);
    if (fresh.has(key) || !link) continue;
    const seconds = over(hop, link);
    if (!worst || seconds > worst.seconds) worst = { hop, link, seconds };
  }
  if (!worst) return [];
  return [`the new plan leaves out link ${name(worst.hop.from)}→${name(worst.hop.to)} (${mbit(worst.link.bandwidth)} Mbit/s, ${seconds(worst.seconds)} a step)`];
}

/** How a link got worse: bandwidth down by LINK_CHANGE, or the round trip up by LINK_CHANGE and at least ROUND_TRIP_CHANGE_MS. */
function slowed(what: string, was: LinkEstimate, is: LinkEstimate): string[] {
  const out: string[] = [];
  if (is.bandwidth * LINK_CHANGE <= was.bandwidth) out.push(`${what} slowed from ${mbit(was.bandwidth)} to ${mbit(is.bandwidth)} Mbit/s`);
  const ms = (l: LinkEstimate) => 2 * l.latency * 1000;
  if (ms(is) >= LINK_CHANGE * ms(was) && ms(is) - ms(was) >= ROUND_TRIP_CHANGE_MS) {
    out.push(`${what}'s round trip grew from ${ms(was).toFixed(1)} to ${ms(is).toFixed(1)} ms`);
  }
  return out;
}

/** A peer id as people see it in logs: its last six characters. */
export function shortName(id: string): string {
  return id.length > 12 ? `…${id.slice(-6)}` : id;
}

function mbit(bandwidth: number): string {
  const v = mbitOf(bandwidth);
  return v >= 10 ? v.toFixed(0) : v.toFixed(1);
}

function seconds(s: number): string {
  if (!Number.isFinite(s)) return '∞ (a worker is gone)';
  return s >= 0.1 ? `${s.toFixed(2)} s` : `${(s * 1000).toFixed(s >= 0.01 ? 0 : 1)} ms`;
}
