import { noGrad, randn, Tensor } from '../../src/tensor/index.ts';

export interface GradcheckResult {
  /** Largest relative error over all inputs' gradients. */
  maxError: number;
  /** Per input: analytic vs numeric gradient, null for inputs that take none. */
  errors: (number | null)[];
}

/**
 * Compares autograd's gradients of sum(fn(...inputs) * w) with central finite
 * differences, all in float64. Float inputs are converted to float64 first.
 */
export function gradcheck(fn: (...xs: Tensor[]) => Tensor, inputs: Tensor[], eps = 1e-6): GradcheckResult {
  const xs = inputs.map((t) => {
    if (t.dtype === 'int32') return t;
    const x = t.to('float64');
    const copy = new Tensor(x.data.slice(), x.shape);
    copy.requiresGrad = true;
    return copy;
  });
  const out = fn(...xs);
  const w = randn(out.shape, { seed: 99, dtype: 'float64' });
  out.mul(w).sum().backward();
  const objective = () =>
    noGrad(() =>
      fn(...xs)
        .mul(w)
        .sum()
        .item(),
    );
  const errors = xs.map((x) => {
    if (x.dtype === 'int32') return null;
    const analytic = x.grad?.data ?? new Float64Array(x.size);
    let err = 0;
    let scale = 1e-3;
    for (let i = 0; i < x.size; i++) {
      const keep = x.data[i];
      x.data[i] = keep + eps;
      const up = objective();
      x.data[i] = keep - eps;
      const down = objective();
      x.data[i] = keep;
      const numeric = (up - down) / (2 * eps);
      err = Math.max(err, Math.abs(numeric - analytic[i]));
      scale = Math.max(scale, Math.abs(numeric));
    }
    return err / scale;
  });
  return { maxError: Math.max(0, ...errors.map((e) => e ?? 0)), errors };
}
