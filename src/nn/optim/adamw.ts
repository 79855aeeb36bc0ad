import { InvalidArgumentError } from '../../errors.ts';
import { type GraphOptimizer, type Tensor, tensor } from '../../tensor/index.ts';
import { TraceError } from '../../errors.ts';
import { Optimizer, type ParamGroup, stateBuffer } from './optimizer.ts';

export interface AdamWOptions {
  /** Learning rate (PyTorch default 1e-3). */
  lr: number;
  /** Decay rates of the first and second moment estimates (default [0.9, 0.999]). */
  betas: [number, number];
  /** Added to the denominator for stability (default 1e-8). */
  eps: number;
  /** Decoupled weight decay (default 1e-2, as PyTorch's AdamW). */
  weightDecay: number;
}

const DEFAULTS: AdamWOptions = { lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 1e-2 };

/**
 * Adam with decoupled weight decay, step for step as PyTorch's `torch.optim.AdamW`
 * (single-tensor path): p ← p(1 − lr·wd); m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
 * p ← p − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε). Moments are float32 as in PyTorch.
 * @example
 * const opt = new AdamW(model.parameters(), { lr: 3e-4 })
 * loss.backward(); opt.step(); opt.zeroGrad()
 */
export class AdamW extends Optimizer<AdamWOptions> implements GraphOptimizer {
  constructor(params: Tensor[] | ParamGroup<AdamWOptions>[], options: Partial<AdamWOptions> = {}) {
    super(params, { ...DEFAULTS, ...options });
  }

  /**
   * The moments of `p` as one [2, ...shape] tensor (exp_avg, then exp_avg_sq) with its step
   * count, or null before its first step: the form checkpoints and the stage protocol carry.
   */
  moments(p: Tensor): { moments: Tensor; step: number } | null {
    const s = this.getState(p);
    if (!s) return null;
    const both = new Float32Array(2 * p.size);
    both.set(s.exp_avg as Float32Array);
    both.set(s.exp_avg_sq as Float32Array, p.size);
    return { moments: tensor(both, [2, ...p.shape]), step: s.step as number };
  }

  /**
   * The moments of `p` as they are held (exp_avg, exp_avg_sq: not copied, so not to be kept or changed) with its step
   * count, or null before its first step: what hashing the state reads.
   */
  momentParts(p: Tensor): { parts: readonly [Float32Array, Float32Array]; step: number } | null {
    const s = this.getState(p);
    if (!s) return null;
    return { parts: [s.exp_avg as Float32Array, s.exp_avg_sq as Float32Array], step: s.step as number };
  }

  /** Restores what `moments` gave (resuming from a checkpoint, or a replica taking over). */
  setMoments(p: Tensor, moments: Tensor, step: number): void {
    if (moments.size !== 2 * p.size) throw new InvalidArgumentError(`the moments of a parameter of ${p.size} values must hold ${2 * p.size}`);
    const d = moments.data as Float32Array;
    this.setState(p, { exp_avg: d.slice(0, p.size), exp_avg_sq: d.slice(p.size), step });
  }

  /**
   * The graph form of `p`'s update (a traced training step compiled as one graph: tensor/backends/graph/
   * step-training.ts): its moment buffers, read and written in place by the graph, and this step's scalars, computed
   * before each run as `update` computes them (the learning rate as it is then: a scheduler's change is seen).
   */
  adamwGraph(p: Tensor): { m: Float32Array; v: Float32Array; scalars: () => Float32Array } | null {
    const group = this.groups.find((g) => g.params.includes(p));
    if (group === undefined) return null;
    if (this.getState(p) === undefined) this.setState(p, {});
    const state = this.getState(p)!;
    const m = stateBuffer(state, 'exp_avg', p.size);
    const v = stateBuffer(state, 'exp_avg_sq', p.size);
    const scalars = (): Float32Array => {
      const s = this.getState(p);
      if (s?.exp_avg !== m || s.exp_avg_sq !== v) {
        throw new TraceError('the optimizer\'s state was replaced (restored from a checkpoint) since the step was compiled: trace it again');
      }
      const { decay, b1, c1, b2, c2, stepSize, bc2Sqrt, eps } = nextStep(s, group.options);
      return Float32Array.of(decay, b1, c1, b2, c2, stepSize, bc2Sqrt, eps);
    };
    return { m, v, scalars };
  }

  protected update(
    p: Tensor,
    grad: Tensor,
    state: Record<string, Float32Array | number>,
    h: AdamWOptions,
  ): void {
    const { decay, b1, c1, b2, c2, stepSize, bc2Sqrt, eps } = nextStep(state, h);
    const m = stateBuffer(state, 'exp_avg', p.size);
    const v = stateBuffer(state, 'exp_avg_sq', p.size);
    const w = p.data;
    const g = grad.data;
    // One fused pass in double precision, rounded to float32 once per stored value.
    for (let i = 0; i < w.length; i++) {
      const gi = g[i];
      const mi = m[i] * b1 + gi * c1;
      const vi = v[i] * b2 + gi * gi * c2;
      m[i] = mi;
      v[i] = vi;
      w[i] = w[i] * decay - (stepSize * mi) / (Math.sqrt(vi) / bc2Sqrt + eps);
    }
  }
}

/** Advances a parameter's step count and gives that step's scalars (the host's update and the graph form share them). */
function nextStep(state: Record<string, Float32Array | number>, h: AdamWOptions) {
  const [b1, b2] = h.betas;
  const step = ((state.step as number | undefined) ?? 0) + 1;
  state.step = step;
  return {
    decay: h.weightDecay !== 0 ? 1 - h.lr * h.weightDecay : 1,
    b1, c1: 1 - b1, b2, c2: 1 - b2,
    stepSize: h.lr / (1 - b1 ** step),
    bc2Sqrt: Math.sqrt(1 - b2 ** step),
    eps: h.eps,
  };
}
