import { InvalidArgumentError, PlanInfeasibleError } from '../errors.ts';
import type { Device, LayerCost, Links, Plan, Stage } from './types.ts';

/**
 * Partition strategies as pure functions over a snapshot of layers and devices.
 * Every plan covers each layer exactly once with contiguous ranges, one range per device.
 */

const DEFAULT_BANDWIDTH = 100e6; // bytes/s: a home link, when nothing was measured
const DEFAULT_LATENCY = 0.005; // s

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

/** Seconds a device needs for layers [s, e) on `tokens` tokens, plus sending the output onwards. */
export function stageSeconds(
  layers: LayerCost[],
  s: number,
  e: number,
  device: Device,
  next: Device | null,
  tokens: number,
  links: Links = {},
): number {
  let flops = 0;
  for (let i = s; i < e; i++) flops += layers[i].flopsPerToken;
  const compute = (flops * tokens) / (device.gflops * 1e9);
  if (next === null) return compute;
  const bw = links.bandwidth?.(device.id, next.id) ?? links.defaultBandwidth ?? DEFAULT_BANDWIDTH;
  const lat = links.latency?.(device.id, next.id) ?? links.defaultLatency ?? DEFAULT_LATENCY;
  return compute + lat + (layers[e - 1].activationBytesPerToken * tokens) / bw;
}

function buildPlan(
  strategy: Plan['strategy'],
  layers: LayerCost[],
  order: Device[],
  cuts: number[],
  tokens: number,
  links: Links,
): Plan {
  const stages: Stage[] = [];
  for (let i = 0; i < order.length; i++) {
    const [start, end] = [cuts[i], cuts[i + 1]];
    let params = 0;
    let bytes = 0;
    for (let l = start; l < end; l++) {
      params += layers[l].params;
      bytes += layers[l].bytes;
    }
    const next = i + 1 < order.length ? order[i + 1] : null;
    const seconds = stageSeconds(layers, start, end, order[i], next, tokens, links);
    stages.push({ device: order[i].id, start, end, params, bytes, seconds });
  }
  return { strategy, stages, bottleneckSeconds: Math.max(...stages.map((s) => s.seconds)) };
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
export function parameterBalanced(layers: LayerCost[], devices: Device[], options: { tokens?: number; links?: Links } = {}): Plan {
  checkInputs(layers, devices);
  const order = devices.slice(0, Math.min(devices.length, layers.length));
  const cuts = parameterBalancedCuts(
    layers.map((l) => l.params),
    order.length,
  );
  return assertFits(buildPlan('parameter-balanced', layers, order, cuts, options.tokens ?? 1, options.links ?? {}), devices, layers);
}

/**
 * The ring memory-weighted strategy (as exo): devices sorted by memory, each takes a
 * contiguous share of the layers proportional to its share of the total memory.
 */
export function ringMemoryWeighted(layers: LayerCost[], devices: Device[], options: { tokens?: number; links?: Links } = {}): Plan {
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
  return assertFits(buildPlan('ring-memory-weighted', layers, used, usedCuts, options.tokens ?? 1, options.links ?? {}), devices, layers);
}

/**
 * For a fixed device order (every device takes at least one layer), the smallest
 * bottleneck, exactly, by dynamic programming over (device, first layer):
 * best[d][s] = min over e of max(time of d on [s, e), best[d + 1][e]). O(devices × layers²),
 * with stage times from prefix sums.
 */
function bestForOrder(layers: LayerCost[], order: Device[], tokens: number, links: Links): { cuts: number[]; bottleneck: number } | null {
  const n = layers.length;
  const k = order.length;
  if (k > n) return null;
  const bytes = prefix(layers.map((l) => l.bytes));
  const flops = prefix(layers.map((l) => l.flopsPerToken));
  const time = (s: number, e: number, d: number): number => {
    const device = order[d];
    const compute = ((flops[e] - flops[s]) * tokens) / (device.gflops * 1e9);
    if (e === n) return compute;
    const next = order[d + 1];
    const bw = links.bandwidth?.(device.id, next.id) ?? links.defaultBandwidth ?? DEFAULT_BANDWIDTH;
    const lat = links.latency?.(device.id, next.id) ?? links.defaultLatency ?? DEFAULT_LATENCY;
    return compute + lat + (layers[e - 1].activationBytesPerToken * tokens) / bw;
  };
  const W = n + 1;
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
        const v = Math.max(time(s, e, d), rest);
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
  return { cuts, bottleneck: best[0] };
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
 * memory, choosing which devices to use and in which order. Exact up to 6 devices
 * (every ordered subset, each solved exactly); beyond that it tries the fastest, the
 * largest and the best speed × memory devices first, at a ladder of stage counts, each
 * order solved exactly.
 */
export function layerAware(layers: LayerCost[], devices: Device[], options: { tokens?: number; links?: Links } = {}): Plan {
  checkInputs(layers, devices);
  const tokens = options.tokens ?? 1;
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
    for (const ranked of [bySpeed, byMemory, byBoth]) for (const k of sizes) orders.push(ranked.slice(0, k));
  }
  let best: { order: Device[]; cuts: number[]; bottleneck: number } | null = null;
  for (const order of orders) {
    const r = bestForOrder(layers, order, tokens, links);
    if (r && (best === null || r.bottleneck < best.bottleneck * (1 - 1e-12))) best = { order, cuts: r.cuts, bottleneck: r.bottleneck };
  }
  if (best === null) throw shortfall(layers, devices);
  return assertFits(buildPlan('layer-aware', layers, best.order, best.cuts, tokens, links), devices, layers);
}

/** Plans with the named strategy (the default is layer-aware). */
export function plan(
  strategy: Plan['strategy'],
  layers: LayerCost[],
  devices: Device[],
  options: { tokens?: number; links?: Links } = {},
): Plan {
  if (strategy === 'parameter-balanced') return parameterBalanced(layers, devices, options);
  if (strategy === 'ring-memory-weighted') return ringMemoryWeighted(layers, devices, options);
  if (strategy === 'layer-aware') return layerAware(layers, devices, options);
  throw new InvalidArgumentError(`unknown strategy '${String(strategy)}' (parameter-balanced, ring-memory-weighted, layer-aware)`);
}
