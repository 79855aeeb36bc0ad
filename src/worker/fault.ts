import { InvalidArgumentError } from '../errors.ts';
import { Generator, type Tensor, tensor, zeros } from '../tensor/index.ts';

/**
 * Ways a worker can cheat or fail, for testing the network's defences (`tensorlink worker --fault`):
 * - noise: adds noise of relative size 1e-3 to its outputs (forward outputs, input gradients);
 * - skip: returns its input (or the gradient it was given) instead of running its layers;
 * - stale: never applies its optimizer steps (and says so in its step records);
 * - scale-grad: multiplies its parameters' gradients by 2;
 * - zero: returns zeros;
 * - replay: returns the output of an earlier micro-batch;
 * - free-ride: contributes zero gradients (as a replica, it sends zeros to the others);
 * - slow: holds each computation SLOW_FAULT_MS before running it (alive and answering, far slower
 *   than it announced: the user's deadlines must treat it as lost).
 */
export const CHEAT_KINDS = ['noise', 'skip', 'stale', 'scale-grad', 'zero', 'replay', 'free-ride'] as const;
export const FAULT_KINDS = [...CHEAT_KINDS, 'slow'] as const;

/** How long a `slow` worker holds a computation: far past any deadline a plan gives a small model. */
export const SLOW_FAULT_MS = 120_000;
export type FaultKind = (typeof FAULT_KINDS)[number];

export interface Fault {
  kind: FaultKind;
  /** The share of its computations it cheats on (default 1). */
  rate: number;
}

/** Parses `KIND[:RATE]`, with a message naming the kinds when it is not one. */
export function parseFault(text: string): Fault {
  const [kind, rateText] = text.split(':');
  if (!(FAULT_KINDS as readonly string[]).includes(kind)) {
    throw new InvalidArgumentError(`--fault takes KIND[:RATE] with KIND one of ${FAULT_KINDS.join(', ')}; got '${text}'`);
  }
  const rate = rateText === undefined ? 1 : Number(rateText);
  if (!(rate > 0 && rate <= 1)) throw new InvalidArgumentError(`the rate of --fault ${kind} must be within (0, 1], got '${rateText}'`);
  return { kind: kind as FaultKind, rate };
}

/** A worker's cheating, drawn per computation from a seeded generator. */
export class FaultInjector {
  private readonly rng: Generator;
  /** Outputs of earlier computations, per kind of output: what `replay` returns. */
  private readonly earlier = new Map<string, Tensor>();
  /** Computations it has cheated on. */
  cheated = 0;

  constructor(
    readonly fault: Fault,
    seed = 1,
  ) {
    this.rng = new Generator(seed);
  }

  private fires(): boolean {
    const fires = this.fault.rate >= 1 || this.rng.uniform() < this.fault.rate;
    if (fires) this.cheated++;
    return fires;
  }

  /** An output as the faulty worker returns it: `what` tells forward outputs from input gradients (replay keeps them apart). */
  output(what: string, honest: Tensor, input: Tensor): Tensor {
    const kind = this.fault.kind;
    if (kind !== 'noise' && kind !== 'skip' && kind !== 'zero' && kind !== 'replay') return honest;
    const before = this.earlier.get(what);
    this.earlier.set(what, honest);
    if (kind === 'replay' && (!before || before.size !== honest.size)) return honest; // nothing earlier to replay yet
    if (kind === 'skip' && (input.dtype !== 'float32' || input.size !== honest.size)) return honest;
    if (!this.fires()) return honest;
    if (kind === 'zero') return zeros(honest.shape);
    if (kind === 'skip') return input.clone();
    if (kind === 'replay') return before!.clone();
    return this.noisy(honest);
  }

  /** y + 1e-3·‖y‖/√n·N(0, 1): noise whose norm is about 1e-3 of the output's. */
  private noisy(y: Tensor): Tensor {
    const d = y.data as Float32Array;
    let sq = 0;
    for (let i = 0; i < d.length; i++) sq += d[i] * d[i];
    const sigma = (1e-3 * Math.sqrt(sq)) / Math.sqrt(d.length);
    const out = new Float32Array(d.length);
    for (let i = 0; i < d.length; i++) out[i] = d[i] + sigma * this.rng.normal();
    return tensor(out, y.shape);
  }

  /** A backward's contribution to its gradients, altered in place (scale-grad doubles it, free-ride zeroes it). */
  contribution(c: Map<string, Tensor>): void {
    const kind = this.fault.kind;
    if (kind !== 'scale-grad' && kind !== 'free-ride') return;
    if (!this.fires()) return;
    for (const t of c.values()) {
      const d = t.data as Float32Array;
      if (kind === 'free-ride') d.fill(0);
      else for (let i = 0; i < d.length; i++) d[i] *= 2;
    }
  }

  /** Waits before a computation (slow): resolves at once for every other fault. */
  async delay(): Promise<void> {
    if (this.fault.kind !== 'slow' || !this.fires()) return;
    await new Promise((r) => setTimeout(r, SLOW_FAULT_MS).unref());
  }

  /** Whether it skips this optimizer step (stale). */
  skipsStep(): boolean {
    return this.fault.kind === 'stale' && this.fires();
  }
}
