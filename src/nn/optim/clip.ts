import type { Tensor } from '../../tensor/index.ts';

/** Σ‖g‖² over the parameters' gradients (one stage's share of a global norm). */
export function gradNormSquared(params: Tensor[]): number {
  let total = 0;
  for (const p of params) {
    if (p.grad === null) continue;
    let s = 0;
    for (const v of p.grad.data) s += v * v;
    total += s;
  }
  return total;
}

/** Multiplies every gradient by `scale` (in place). */
export function scaleGrads(params: Tensor[], scale: number): void {
  for (const p of params) {
    if (p.grad === null) continue;
    const g = p.grad.data;
    for (let i = 0; i < g.length; i++) g[i] *= scale;
  }
}

/** The factor PyTorch's clip_grad_norm_ applies for a total norm: min(1, max/(norm + 1e-6)). */
export function clipScale(totalNorm: number, maxNorm: number): number {
  return Math.min(1, maxNorm / (totalNorm + 1e-6));
}

/**
 * Scales gradients so that their global L2 norm is at most `maxNorm` and returns the
 * norm before clipping, as `torch.nn.utils.clip_grad_norm_`.
 */
export function clipGradNorm(params: Tensor[], maxNorm: number): number {
  const norm = Math.sqrt(gradNormSquared(params));
  const scale = clipScale(norm, maxNorm);
  if (scale < 1) scaleGrads(params, scale);
  return norm;
}
