import { PlanInfeasibleError } from '../errors.ts';
import { stageHops } from './cost.ts';
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

/** A link is said to have changed when its bandwidth or latency moved by this factor or more. */
const LINK_CHANGE = 2;

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
  if (!(after < before * (1 - (input.gain ?? REPLAN_GAIN)))) return null;
  const name = input.name ?? shortName;
  const causes = [
    ...deviceChanges(current, proposed, now, input.before, name),
    ...linkChanges(current, layers, options, now, input.before, name),
  ];
  if (causes.length === 0) causes.push('a faster plan over the same workers');
  return { reason: `${causes.join('; ')}: predicted ${seconds(before)} → ${seconds(after)} per step`, plan: proposed, current: before, proposed: after };
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

/**
 * The links the current plan crosses that changed by LINK_CHANGE or more since `before` (or,
 * without it, that run below a tenth of the fastest link measured).
 */
function linkChanges(
  current: Plan,
  layers: LayerCost[],
  options: PlanOptions,
  now: Swarm,
  before: Swarm | undefined,
  name: (id: string) => string,
): string[] {
  const out: string[] = [];
  const seen = new Set<string>();
  const fastest = Math.max(0, ...[...now.links.values()].flatMap((row) => [...row.values()].map((l) => l.bandwidth)));
  current.stages.forEach((s, i) => {
    const next = i + 1 < current.stages.length ? current.stages[i + 1].device : null;
    for (const hop of stageHops(layers, s.start, s.end, s.device, next, i === 0, options)) {
      const key = `${hop.from}>${hop.to}`;
      if (seen.has(key)) continue;
      seen.add(key);
      const was = before ? linkBetween(before.links, hop.from, hop.to) : undefined;
      const is = linkBetween(now.links, hop.from, hop.to);
      const what = `link ${name(hop.from)}→${name(hop.to)}`;
      if (is && was) out.push(...changed(what, was, is));
      else if (is && !before && is.bandwidth * 10 < fastest) out.push(`${what} runs at ${mbit(is.bandwidth)} Mbit/s`);
    }
  });
  return out;
}

function changed(what: string, was: LinkEstimate, is: LinkEstimate): string[] {
  const out: string[] = [];
  if (is.bandwidth * LINK_CHANGE <= was.bandwidth) out.push(`${what} slowed from ${mbit(was.bandwidth)} to ${mbit(is.bandwidth)} Mbit/s`);
  else if (is.bandwidth >= was.bandwidth * LINK_CHANGE) out.push(`${what} sped up from ${mbit(was.bandwidth)} to ${mbit(is.bandwidth)} Mbit/s`);
  const ms = (l: LinkEstimate) => 2 * l.latency * 1000;
  if (ms(is) >= 1 && ms(is) >= LINK_CHANGE * ms(was)) out.push(`${what}'s round trip grew from ${ms(was).toFixed(1)} to ${ms(is).toFixed(1)} ms`);
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
