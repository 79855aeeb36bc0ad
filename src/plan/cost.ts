import type { Device, LayerCost, Links, PlanOptions, Traffic } from './types.ts';

/**
 * The planner's cost model: what one step costs a stage in compute and in the hops charged to it.
 *
 * A hop is scored as the DCI article scores a link, α·latency + β/bandwidth, with α and β chosen
 * so that the score is the hop's predicted seconds per step (and so adds to compute time):
 * - α = the messages that cross the hop per step: each waits one one-way latency;
 * - β = the bytes that cross it per step: tokens × activation bytes per token.
 * Per kind of traffic (b_in, b_out: bytes per token of a stage's input and output; m micro-batches):
 * - chain (generation, hidden states worker to worker): stage → next stage α = 1, β = tokens·b_out;
 *   with the user given, user → first stage α = 1, β = tokens·b_in, last stage → user α = 1, β = tokens·b_out;
 * - relay (the user passes hidden states): user → stage α = 1, β = tokens·b_in, and stage → user α = 1, β = tokens·b_out;
 * - train (worker to worker, forward then backward; m micro-batches): activations go stage → next
 *   stage and their gradients next → stage, α = m, β = tokens·b_out each way; the first stage takes
 *   the user's input and sends its gradient back (user ⇄ first α = m, β = tokens·b_in each way), the
 *   last sends its output to the user and takes the loss's gradient (last ⇄ user α = m, β = tokens·b_out);
 *   the user requests every forward and backward and is answered with the record (user ⇄ stage
 *   α = 2m more each way, β ≈ 0). Compute is 3× the forward's (the backward costs about two forwards).
 * Latency is per message, so α counts messages, not bytes; bandwidth is what a long transfer
 * achieves (measured on transfers big enough to leave slow start), so β/bandwidth is its duration.
 */

/** Bandwidth (bytes/s) when nothing was measured: a home link. */
export const DEFAULT_BANDWIDTH = 100e6;
/** One-way latency (s) when nothing was measured. */
export const DEFAULT_LATENCY = 0.005;
/** The user's id in hops when the plan was not told it (its links then take the defaults). */
const USER = '(user)';
/** A training step's compute against a forward's: the backward costs about two forwards. */
const TRAIN_COMPUTE = 3;

/** One hop's traffic per step: α messages and β bytes from one device to another. */
export interface Hop {
  from: string;
  to: string;
  alpha: number;
  beta: number;
}

/** The link a hop crosses: [one-way latency s, bytes/s], measured or the defaults. */
export function linkOf(links: Links, from: string, to: string): [number, number] {
  const bw = links.bandwidth?.(from, to) ?? links.defaultBandwidth ?? DEFAULT_BANDWIDTH;
  const lat = links.latency?.(from, to) ?? links.defaultLatency ?? DEFAULT_LATENCY;
  return [lat, bw];
}

/** A hop's predicted seconds per step: α·latency + β/bandwidth. */
export function hopSeconds(links: Links, hop: Hop): number {
  const [lat, bw] = linkOf(links, hop.from, hop.to);
  return hop.alpha * lat + hop.beta / bw;
}

/** The step a plan times, from its options with their defaults. */
interface Workload {
  tokens: number;
  traffic: Traffic;
  micro: number;
  user: string | null;
  inputBytes: number;
}

function workloadOf(layers: LayerCost[], options: PlanOptions): Workload {
  return {
    tokens: options.tokens ?? 1,
    traffic: options.traffic ?? 'chain',
    micro: Math.max(1, options.microBatches ?? 1),
    user: options.user ?? null,
    inputBytes: options.inputBytesPerToken ?? layers[0]?.activationBytesPerToken ?? 0,
  };
}

/**
 * The hops charged to the stage of layers [s, e) on `device`, followed by `next` (null for the
 * last stage); `first` for the first stage (in a chain it takes the user's input).
 */
export function stageHops(
  layers: LayerCost[],
  s: number,
  e: number,
  device: string,
  next: string | null,
  first: boolean,
  options: PlanOptions = {},
): Hop[] {
  const w = workloadOf(layers, options);
  const bIn = w.tokens * (s === 0 ? w.inputBytes : layers[s - 1].activationBytesPerToken);
  const bOut = w.tokens * layers[e - 1].activationBytesPerToken;
  const user = w.user ?? USER;
  if (w.traffic === 'relay') return [{ from: user, to: device, alpha: 1, beta: bIn }, { from: device, to: user, alpha: 1, beta: bOut }];
  if (w.traffic === 'train') {
    const m = w.micro;
    // the user's requests and the answers with records (2m each way), and the first stage's input and its gradient
    const alpha = 2 * m + (first ? m : 0);
    const beta = first ? bIn : 0;
    const hops = [{ from: user, to: device, alpha, beta }, { from: device, to: user, alpha, beta }];
    if (next !== null) hops.push({ from: device, to: next, alpha: m, beta: bOut }, { from: next, to: device, alpha: m, beta: bOut });
    else for (const h of hops) {
      h.alpha += m;
      h.beta += bOut;
    }
    return hops;
  }
  const hops: Hop[] = [];
  if (first && w.user !== null) hops.push({ from: w.user, to: device, alpha: 1, beta: bIn });
  if (next !== null) hops.push({ from: device, to: next, alpha: 1, beta: bOut });
  else if (w.user !== null) hops.push({ from: device, to: w.user, alpha: 1, beta: bOut });
  return hops;
}

function prefix(values: number[]): number[] {
  const out = [0];
  for (const v of values) out.push(out[out.length - 1] + v);
  return out;
}

/**
 * Seconds per step of device `d` of `order` on layers [s, e): compute from FLOPs and the
 * device's speed, plus its hops. The links of the order are looked up once, so the planner's
 * dynamic programme calls this O(devices × layers²) times at the cost of arithmetic.
 */
export function stageTimer(layers: LayerCost[], order: Device[], options: PlanOptions = {}): (s: number, e: number, d: number) => number {
  const w = workloadOf(layers, options);
  const links = options.links ?? {};
  const flops = prefix(layers.map((l) => l.flopsPerToken));
  const user = w.user ?? USER;
  const toNext = order.map((dev, d) => (d + 1 < order.length ? linkOf(links, dev.id, order[d + 1].id) : null));
  const fromNext = order.map((dev, d) => (d + 1 < order.length ? linkOf(links, order[d + 1].id, dev.id) : null));
  const fromUser = order.map((dev) => linkOf(links, user, dev.id));
  const toUser = order.map((dev) => linkOf(links, dev.id, user));
  const factor = w.traffic === 'train' ? TRAIN_COMPUTE : 1;
  return (s, e, d) => {
    const compute = (factor * (flops[e] - flops[s]) * w.tokens) / (order[d].gflops * 1e9);
    const bIn = w.tokens * (s === 0 ? w.inputBytes : layers[s - 1].activationBytesPerToken);
    const bOut = w.tokens * layers[e - 1].activationBytesPerToken;
    const [inLat, inBw] = fromUser[d];
    const [outLat, outBw] = toUser[d];
    if (w.traffic === 'relay') return compute + inLat + bIn / inBw + outLat + bOut / outBw;
    if (w.traffic === 'train') {
      const m = w.micro;
      const next = toNext[d];
      const back = fromNext[d];
      // with the user: requests and answers (2m each way), the first stage's input and its gradient, the last's output and its gradient
      const userBytes = (d === 0 ? bIn : 0) + (next === null ? bOut : 0);
      const userAlpha = 2 * m + (d === 0 ? m : 0) + (next === null ? m : 0);
      let t = compute + userAlpha * (inLat + outLat) + userBytes / inBw + userBytes / outBw;
      if (next !== null && back !== null) t += m * (next[0] + back[0]) + bOut / next[1] + bOut / back[1];
      return t;
    }
    let t = compute;
    if (d === 0 && w.user !== null) t += inLat + bIn / inBw;
    const next = toNext[d];
    if (next !== null) t += next[0] + bOut / next[1];
    else if (w.user !== null) t += outLat + bOut / outBw;
    return t;
  };
}
