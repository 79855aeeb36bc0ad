import { InvalidArgumentError } from '../errors.ts';
import { type CausalLM, createModel } from '../models/index.ts';
import { Generator, packWeight, type Tensor, tensor, unpackMatrix, zeros } from '../tensor/index.ts';

/**
 * Ways a worker can cheat or fail, for testing the network's defences (`tensorlink worker --fault`):
 * - noise: adds noise of relative size 1e-3 to its outputs (forward outputs, input gradients);
 * - skip: returns its input (or the gradient it was given) instead of running its layers;
 * - stale: never applies its optimizer steps (and says so in its step records);
 * - scale-grad: multiplies its parameters' gradients by 2 (in a job with local steps, the change it sends: user/scoring.ts);
 * - zero: returns zeros;
 * - replay: returns the output of an earlier micro-batch;
 * - free-ride: contributes zero gradients (as a replica, it sends zeros to the others; with local steps, no change);
 * - slow: holds each computation SLOW_FAULT_MS before running it (alive and answering, far slower
 *   than it announced: the user's deadlines must treat it as lost);
 * - substitute:int4 / substitute:other: a host serves a cheaper model than the one it announces: its hosted blocks'
 *   matrices held in int4 (whatever format it announces), or the weights of another seed of the same shape; it still
 *   announces, and signs in its records, the hash of the checkpoint it loaded. Written `substitute:int4` (no rate: the
 *   model it holds is the one it computes with, every time);
 * - stale-adapter: a job that loads new LoRA factors over the section it holds (a rollout job given the policy's update:
 *   DistributedModel.setAdapter) keeps the ones it had, and computes and signs with them.
 */
export const CHEAT_KINDS = ['noise', 'skip', 'stale', 'scale-grad', 'zero', 'replay', 'free-ride'] as const;
export const FAULT_KINDS = [...CHEAT_KINDS, 'slow', 'substitute', 'stale-adapter'] as const;
/** What a `substitute` host computes with instead of the model it announces. */
export const SUBSTITUTES = ['int4', 'other'] as const;
export type Substitute = (typeof SUBSTITUTES)[number];
/** The seed of the weights a `substitute:other` host computes with. */
const OTHER_SEED = 7919;

/** How long a `slow` worker holds a computation: far past any deadline a plan gives a small model. */
export const SLOW_FAULT_MS = 120_000;
export type FaultKind = (typeof FAULT_KINDS)[number];

export interface Fault {
  kind: FaultKind;
  /** The share of its computations it cheats on (default 1). */
  rate: number;
  /** A `substitute` fault: what it computes with. */
  substitute?: Substitute;
}

/** Parses `KIND[:RATE]` or `substitute:int4|other`, with a message naming the kinds when it is not one. */
export function parseFault(text: string): Fault {
  const [kind, rateText] = text.split(':');
  if (!(FAULT_KINDS as readonly string[]).includes(kind)) {
    throw new InvalidArgumentError(`--fault takes KIND[:RATE], substitute:${SUBSTITUTES.join('|')} or stale-adapter, with KIND one of ${CHEAT_KINDS.join(', ')}, slow; got '${text}'`);
  }
  if (kind === 'substitute') {
    if (!(SUBSTITUTES as readonly string[]).includes(rateText ?? '') || text.split(':').length !== 2) {
      throw new InvalidArgumentError(`--fault substitute takes what the host computes with instead: substitute:int4 or substitute:other; got '${text}'`);
    }
    return { kind, rate: 1, substitute: rateText as Substitute };
  }
  if (kind === 'stale-adapter' && rateText !== undefined) throw new InvalidArgumentError(`--fault stale-adapter takes no rate; got '${text}'`);
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
    // a browser tab's timers have no unref
    await new Promise((r) => setTimeout(r, SLOW_FAULT_MS).unref?.());
  }

  /**
   * A hosted section as a `substitute` host computes with it (in place): its matrices held in int4, or another seed's
   * weights. Nothing for any other fault.
   */
  substitute(model: CausalLM): void {
    const how = this.fault.substitute;
    if (this.fault.kind !== 'substitute' || !how) return;
    this.cheated++;
    if (how === 'other') {
      // the whole model drawn from another seed (a section is built uninitialised), its weights taken by name
      const other = createModel(model.config, { seed: OTHER_SEED }).stateDict();
      for (const [name, t] of model.stateDict()) {
        const o = other.get(name);
        if (!o) continue;
        // held as the announced format holds it: only the values are another model's
        if (t.packed) packWeight(t, t.packed.format, o.data as Float32Array);
        else (t.data as Float32Array).set(o.data as Float32Array);
      }
      return;
    }
    for (const [, t] of model.hfStateDict()) {
      if (t.ndim === 2 && t.packed?.format !== 'int4') packWeight(t, 'int4', t.packed ? unpackMatrix(t.packed) : t.data);
    }
  }

  /** Whether it skips this optimizer step (stale). */
  skipsStep(): boolean {
    return this.fault.kind === 'stale' && this.fires();
  }
}
