import type { Tensor } from '../../tensor/index.ts';
import { Optimizer, type ParamGroup, stateBuffer } from './optimizer.ts';

export interface SGDOptions {
  lr: number;
  /** Momentum factor (default 0: plain SGD). */
  momentum: number;
  /** Dampening of the momentum term (default 0). */
  dampening: number;
  /** L2 penalty added to the gradient (default 0). */
  weightDecay: number;
  /** Nesterov momentum (default false). */
  nesterov: boolean;
}

const DEFAULTS: SGDOptions = { lr: 1e-2, momentum: 0, dampening: 0, weightDecay: 0, nesterov: false };

/**
 * Stochastic gradient descent with momentum, as PyTorch's `torch.optim.SGD`:
 * d = g + wd·p; b ← d (first step) or μb + (1−τ)d; d ← d + μb (Nesterov) or b; p ← p − lr·d.
 */
export class SGD extends Optimizer<SGDOptions> {
  constructor(params: Tensor[] | ParamGroup<SGDOptions>[], options: Partial<SGDOptions> = {}) {
    super(params, { ...DEFAULTS, ...options });
  }

  protected update(
    p: Tensor,
    grad: Tensor,
    state: Record<string, Float32Array | number>,
    h: SGDOptions,
  ): void {
    const w = p.data;
    const g = grad.data;
    const first = state.momentum_buffer === undefined;
    const buf = h.momentum !== 0 ? stateBuffer(state, 'momentum_buffer', p.size) : null;
    for (let i = 0; i < w.length; i++) {
      let d = h.weightDecay !== 0 ? Math.fround(g[i] + h.weightDecay * w[i]) : g[i];
      if (buf !== null) {
        buf[i] = first ? d : buf[i] * h.momentum + (1 - h.dampening) * d;
        d = h.nesterov ? Math.fround(d + h.momentum * buf[i]) : buf[i];
      }
      w[i] -= h.lr * d;
    }
  }
}
