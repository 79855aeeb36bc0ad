import { InvalidArgumentError, PlanInfeasibleError } from '../errors.ts';
import { linkOf, stageTimer } from './cost.ts';
import type { Device, LayerCost, Links, Plan, PlanOptions, Stage } from './types.ts';

/**
 * Partition strategies as pure functions over a snapshot of layers and devices.
 * Every plan covers each layer exactly once with contiguous ranges, one range per device.
 * Stage times come from the cost model in cost.ts (compute, and the hops over the links).
 */

function prefix(values: number[]): number[] {
  const out = [0];
  for (const v of values) out.push(out[out.length - 1] + v);
  return out;
}

function mib(bytes: number): string {
  return bytes < 1024 ** 2 ? `${bytes} bytes` : `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
}

/**
 * Why contiguous sections cannot fit although the memory adds up (the devices' spare room is
 * split into pieces no layer fits): the largest devices first, each taking layers in order while
 * they fit; the first layer left over is named with what is missing.
 */
function shortfall(layers: LayerCost[], devices: Device[]): PlanInfeasibleError {
  const free = [...devices].sort((a, b) => b.memoryBytes - a.memoryBytes).map((d) => d.memoryBytes);
  let d = 0;
  let i = 0;
  while (i < layers.length && d < free.length) {
    if (layers[i].bytes <= free[d]) free[d] -= layers[i++].bytes;
    else d++;
  }
  const rest = layers.slice(i).reduce((sum, l) => sum + l.bytes, 0);
  const name = layers[Math.min(i, layers.length - 1)].name;
  return new PlanInfeasibleError(
    `no contiguous split fits: from layer ${name} on, ${mib(rest)} of layers find no device with room (the devices' spare memory is split into pieces smaller than the next layer)`,
    { details: { layer: name, needed: rest } },
  );
}

function checkInputs(layers: LayerCost[], devices: Device[]): void {
  if (layers.length === 0) throw new InvalidArgumentError('a model needs at least one layer to plan');
  if (devices.length === 0) throw new PlanInfeasibleError('no devices are available');
}

/**
 * Seconds a device needs for layers [s, e) on `tokens` tokens, plus sending the output on to
 * `next` (a chain's hop; the user's hops are not counted here: see `stageTimer`).
 */
export function stageSeconds(
  layers: LayerCost[],
  s: number,
  e: number,
  device: Device,
  next: Device | null,
  tokens: number,
  links: Links = {},
): number {
  return stageTimer(layers, next ? [device, next] : [device], { tokens, links })(s, e, 0);
}

function buildPlan(strategy: Plan['strategy'], layers: LayerCost[], order: Device[], cuts: number[], options: PlanOptions): Plan {
  const time = stageTimer(layers, order, options);
  const stages: Stage[] = [];
  for (let i = 0; i < order.length; i++) {
    const [start, end] = [cuts[i], cuts[i + 1]];
    let params = 0;
    let bytes = 0;
    for (let l = start; l < end; l++) {
      params += layers[l].params;
      bytes += layers[l].bytes;
    }
    stages.push({ device: order[i].id, start, end, params, bytes, seconds: time(start, end, i) });
  }
  return { strategy, stages, bottleneckSeconds: Math.max(...stages.map((s) => s.seconds)) };
}

/**
 * Seconds of one step through a plan with `microBatches` micro-batches in flight: the first
 * passes every stage in turn, each later one follows a bottleneck behind, (Σ + (m − 1)·max) / m
 * of the stages' per-step seconds. With 1 (a decoding step, a forward) it is their sum.
 */
export function stepSeconds(plan: Plan, microBatches = 1): number {
  const m = Math.max(1, microBatches);
  const sum = plan.stages.reduce((a, s) => a + s.seconds, 0);
  return (sum + (m - 1) * plan.bottleneckSeconds) / m;
}

/**
 * A plan's stages timed again over other devices and links (the same cuts, the same order),
 * or null when one of its devices is gone. Memory is not checked: the plan's sections already
 * hold theirs.
 */
export function evaluatePlan(current: Plan, layers: LayerCost[], devices: Device[], options: PlanOptions = {}): Plan | null {
  const byId = new Map(devices.map((d) => [d.id, d]));
  const order = current.stages.map((s) => byId.get(s.device));
  if (order.some((d) => d === undefined)) return null;
  const cuts = [0, ...current.stages.map((s) => s.end)];
  return buildPlan(current.strategy, layers, order as Device[], cuts, options);
}

function assertFits(plan: Plan, devices: Device[], layers: LayerCost[]): Plan {
  const byId = new Map(devices.map((d) => [d.id, d]));
  for (const s of plan.stages) {
    const d = byId.get(s.device)!;
    if (s.bytes > d.memoryBytes) {
      throw new PlanInfeasibleError(
        `${plan.strategy}: layers ${layers[s.start].name}..${layers[s.end - 1].name} need ${mib(s.bytes)}, device ${d.id} offers ${mib(d.memoryBytes)} (${mib(s.bytes - d.memoryBytes)} short)`,
        { details: { layer: layers[s.start].name, device: d.id, needed: s.bytes, offered: d.memoryBytes } },
      );
    }
  }
  return plan;
}

/**
 * k contiguous sections whose largest parameter count is as small as possible (exact:
 * binary search on the bound with a greedy check, O(n log P)).
 */
export function parameterBalancedCuts(params: number[], k: number): number[] {
  const n = params.length;
  if (k < 1) throw new InvalidArgumentError('need at least one section');
  const sections = Math.min(k, n);
  /** Greedy sections under `limit` (fewest possible), or null if a layer alone exceeds it. */
  const greedy = (limit: number): number[] | null => {
    const cuts = [0];
    let sum = 0;
    for (let i = 0; i < n; i++) {
      if (params[i] > limit) return null;
      if (sum + params[i] > limit) {
        cuts.push(i);
        sum = 0;
      }
      sum += params[i];
    }
    cuts.push(n);
    return cuts;
  };
  let lo = Math.max(...params);
  let hi = params.reduce((a, b) => a + b, 0);
  while (lo < hi) {
    const mid = Math.floor((lo + hi) / 2);
    const cuts = greedy(mid);
    if (cuts && cuts.length - 1 <= sections) hi = mid;
    else lo = mid + 1;
  }
  const cuts = greedy(lo)!;
  // Fewer sections than devices: split multi-layer sections (a split never raises the maximum).
  while (cuts.length - 1 < sections) {
    for (let i = 0; i < cuts.length - 1; i++) {
      if (cuts[i + 1] - cuts[i] >= 2) {
        cuts.splice(i + 1, 0, cuts[i + 1] - 1);
        break;
      }
    }
  }
  return cuts;
}

/** The parameter-balanced strategy: equal parameter sections on the devices in the given order. */
export function parameterBalanced(layers: LayerCost[], devices: Device[], options: PlanOptions = {}): Plan {
  checkInputs(layers, devices);
  const order = devices.slice(0, Math.min(devices.length, layers.length));
  const cuts = parameterBalancedCuts(
    layers.map((l) => l.params),
    order.length,
  );
  return assertFits(buildPlan('parameter-balanced', layers, order, cuts, options), devices, layers);
}

/**
 * The ring memory-weighted strategy (as exo): devices sorted by memory, each takes a
 * contiguous share of the layers proportional to its share of the total memory.
 */
export function ringMemoryWeighted(layers: LayerCost[], devices: Device[], options: PlanOptions = {}): Plan {
  checkInputs(layers, devices);
  const order = [...devices].sort((a, b) => b.memoryBytes - a.memoryBytes || a.id.localeCompare(b.id));
  const total = order.reduce((s, d) => s + d.memoryBytes, 0);
  const n = layers.length;
  const cuts = [0];
  let acc = 0;
  for (let i = 0; i < order.length - 1; i++) {
    acc += order[i].memoryBytes;
    cuts.push(Math.min(n, Math.max(cuts[cuts.length - 1], Math.round((acc / total) * n))));
  }
  cuts.push(n);
  const used: Device[] = [];
  const usedCuts = [0];
  for (let i = 0; i < order.length; i++) {
    if (cuts[i + 1] > cuts[i]) {
      used.push(order[i]);
      usedCuts.push(cuts[i + 1]);
    }
  }
  return assertFits(buildPlan('ring-memory-weighted', layers, used, usedCuts, options), devices, layers);
}

/** The best cuts of one device order: its bottleneck, and the sum of its stage times. */
interface OrderPlan {
  cuts: number[];
  bottleneck: number;
  total: number;
}

/** Relative slack under which two times count as equal (rounding in sums of seconds). */
const TIE = 1e-9;

/**
 * For a fixed device order (every device takes at least one layer), the smallest bottleneck,
 * and among the cuts that reach it the smallest sum of stage times (one step alone, a decoding
 * step), exactly: first best[d][s] = min over e of max(time of d on [s, e), best[d + 1][e]),
 * then the same programme minimising the sum with every stage under that bottleneck.
 * O(devices × layers²) each, with stage times from prefix sums.
 */
function bestForOrder(layers: LayerCost[], order: Device[], options: PlanOptions): OrderPlan | null {
  const n = layers.length;
  const k = order.length;
  if (k > n) return null;
  const bytes = prefix(layers.map((l) => l.bytes));
  const time = stageTimer(layers, order, options);
  const W = n + 1;
  /** best[d][s] under `combine` (max for the bottleneck, sum for the total), stages limited to `cap`. */
  const solve = (combine: (t: number, rest: number) => number, cap: number) => {
    const best = new Float64Array((k + 1) * W).fill(Number.POSITIVE_INFINITY);
    const choice = new Int32Array((k + 1) * W).fill(-1);
    best[k * W + n] = 0;
    for (let d = k - 1; d >= 0; d--) {
      // device d needs at least one layer and must leave one for each later device
      for (let s = n - (k - d); s >= d; s--) {
        let b = Number.POSITIVE_INFINITY;
        let c = -1;
        const lastEnd = d === k - 1 ? n : n - (k - d - 1);
        for (let e = s + 1; e <= lastEnd && bytes[e] - bytes[s] <= order[d].memoryBytes; e++) {
          const rest = best[(d + 1) * W + e];
          if (rest === Number.POSITIVE_INFINITY) continue;
          const t = time(s, e, d);
          if (t > cap) continue;
          const v = combine(t, rest);
          if (v < b) {
            b = v;
            c = e;
          }
        }
        best[d * W + s] = b;
        choice[d * W + s] = c;
      }
    }
    if (best[0] === Number.POSITIVE_INFINITY) return null;
    const cuts = [0];
    for (let d = 0; d < k; d++) cuts.push(choice[d * W + cuts[d]]);
    return { cuts, value: best[0] };
  };
  const minmax = solve(Math.max, Number.POSITIVE_INFINITY);
  if (minmax === null) return null;
  const minsum = solve((t, rest) => t + rest, minmax.value * (1 + TIE))!;
  let bottleneck = 0;
  for (let d = 0; d < k; d++) bottleneck = Math.max(bottleneck, time(minsum.cuts[d], minsum.cuts[d + 1], d));
  return { cuts: minsum.cuts, bottleneck, total: minsum.value };
}

/** Whether `a` beats `b`: a smaller bottleneck, or the same one and a smaller sum. */
function better(a: OrderPlan, b: OrderPlan | null): boolean {
  if (b === null || a.bottleneck < b.bottleneck * (1 - TIE)) return true;
  return a.bottleneck <= b.bottleneck * (1 + TIE) && a.total < b.total * (1 - TIE);
}

/**
 * `devices` reordered into a chain that avoids slow links: from the device the user reaches
 * fastest (or the first), each next one the device its predecessor reaches fastest, hops priced
 * as a chain's (one message of `bytes`, see cost.ts).
 */
function linkAwareOrder(devices: Device[], links: Links, bytes: number, user: string | undefined): Device[] {
  const cost = (from: string, to: string) => {
    const [lat, bw] = linkOf(links, from, to);
    return lat + bytes / bw;
  };
  const left = [...devices];
  const startAt = user === undefined ? 0 : left.reduce((best, d, i) => (cost(user, d.id) < cost(user, left[best].id) ? i : best), 0);
  const order = left.splice(startAt, 1);
  while (left.length > 0) {
    const last = order[order.length - 1].id;
    const i = left.reduce((best, d, j) => (cost(last, d.id) < cost(last, left[best].id) ? j : best), 0);
    order.push(...left.splice(i, 1));
  }
  return order;
}

function permutations<T>(items: T[], size: number): T[][] {
  if (size === 0) return [[]];
  const out: T[][] = [];
  items.forEach((item, i) => {
    for (const rest of permutations([...items.slice(0, i), ...items.slice(i + 1)], size - 1)) out.push([item, ...rest]);
  });
  return out;
}

/** Orders of devices searched exhaustively up to this many devices; beyond, ranked orders are tried. */
const EXACT_DEVICES = 6;

/**
 * The layer-aware strategy: minimise the slowest stage (compute from FLOPs and device
 * speed, plus sending activations over the link to the next device), within every device's
 * memory, choosing which devices to use and in which order; of the plans with the smallest
 * bottleneck, the one whose single step (the sum of its stages) is fastest. The links are
 * the measured ones where given (`measuredLinks`): a chain is ordered so that its hops avoid
 * slow links, a slow user link keeps a device from the chain's ends. Exact up to 6 devices
 * (every ordered subset, each solved exactly); beyond that it tries the fastest, the largest
 * and the best speed × memory devices first, at a ladder of stage counts, each also reordered
 * to avoid slow links, each order solved exactly.
 */
export function layerAware(layers: LayerCost[], devices: Device[], options: PlanOptions = {}): Plan {
  checkInputs(layers, devices);
  const links = options.links ?? {};
  const largest = Math.max(...devices.map((d) => d.memoryBytes));
  const biggest = layers.reduce((a, b) => (b.bytes > a.bytes ? b : a));
  if (biggest.bytes > largest) {
    throw new PlanInfeasibleError(`layer ${biggest.name} needs ${mib(biggest.bytes)}, the largest device offers ${mib(largest)} (${mib(biggest.bytes - largest)} short)`, {
      details: { layer: biggest.name, needed: biggest.bytes, offered: largest },
    });
  }
  const totalBytes = layers.reduce((s, l) => s + l.bytes, 0);
  const totalMemory = devices.reduce((s, d) => s + d.memoryBytes, 0);
  if (totalBytes > totalMemory) {
    throw new PlanInfeasibleError(`the model needs ${mib(totalBytes)}, all devices together offer ${mib(totalMemory)} (${mib(totalBytes - totalMemory)} short)`, {
      details: { needed: totalBytes, offered: totalMemory },
    });
  }
  const orders: Device[][] = [];
  if (devices.length <= EXACT_DEVICES) {
    for (let k = 1; k <= Math.min(devices.length, layers.length); k++) orders.push(...permutations(devices, k));
  } else {
    const bySpeed = [...devices].sort((a, b) => b.gflops - a.gflops);
    const byMemory = [...devices].sort((a, b) => b.memoryBytes - a.memoryBytes);
    const byBoth = [...devices].sort((a, b) => b.gflops * b.memoryBytes - a.gflops * a.memoryBytes);
    const most = Math.min(devices.length, layers.length);
    const sizes = new Set<number>([most]);
    for (let k = 1; k < most; k = Math.ceil(k * 1.5)) sizes.add(k);
    const bytes = (options.tokens ?? 1) * (layers.reduce((a, l) => a + l.activationBytesPerToken, 0) / layers.length);
    for (const ranked of [bySpeed, byMemory, byBoth]) {
      for (const k of sizes) orders.push(ranked.slice(0, k), linkAwareOrder(ranked.slice(0, k), links, bytes, options.user));
    }
  }
  let best: (OrderPlan & { order: Device[] }) | null = null;
  for (const order of orders) {
    const r = bestForOrder(layers, order, options);
    if (r && better(r, best)) best = { ...r, order };
  }
  if (best === null) throw shortfall(layers, devices);
  return assertFits(buildPlan('layer-aware', layers, best.order, best.cuts, options), devices, layers);
}

/** Plans with the named strategy (the default is layer-aware). */
export function plan(strategy: Plan['strategy'], layers: LayerCost[], devices: Device[], options: PlanOptions = {}): Plan {
  if (strategy === 'parameter-balanced') return parameterBalanced(layers, devices, options);
  if (strategy === 'ring-memory-weighted') return ringMemoryWeighted(layers, devices, options);
  if (strategy === 'layer-aware') return layerAware(layers, devices, options);
  throw new InvalidArgumentError(`unknown strategy '${String(strategy)}' (parameter-balanced, ring-memory-weighted, layer-aware)`);
}
