import { record } from '../autograd.ts';
import { allocate, assertFloat, type FloatArray } from '../dtype.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';

/**
 * The exact GELU, x · Φ(x) = x/2 · (1 + erf(x/√2)): PyTorch's nn.GELU() and transformers'
 * `gelu` activation, as against the tanh approximation of `gelu`
 * (transformers' gelu_new). The derivative is Φ(x) + x · φ(x), φ the normal density.
 */
export function geluErf(x: Tensor): Tensor {
  if (hooked) return hook('geluErf', geluErf, [x]);
  assertFloat(x.dtype, 'geluErf');
  const src = x.data as FloatArray;
  const out = allocate(x.dtype, src.length) as FloatArray;
  for (let i = 0; i < src.length; i++) {
    const v = src[i];
    out[i] = 0.5 * v * (1 + erf(v * Math.SQRT1_2));
  }
  return record(new Tensor(out, x.shape), 'geluErf', [x], (g) => {
    const gx = allocate(x.dtype, src.length) as FloatArray;
    const gd = g.data as FloatArray;
    for (let i = 0; i < src.length; i++) {
      const v = src[i];
      const cdf = 0.5 * (1 + erf(v * Math.SQRT1_2));
      gx[i] = gd[i] * (cdf + v * INV_SQRT_2PI * Math.exp(-0.5 * v * v));
    }
    return [new Tensor(gx, x.shape)];
  });
}

const INV_SQRT_2PI = 1 / Math.sqrt(2 * Math.PI);

// erf in double precision, after fdlibm's s_erf.c (Sun Microsystems, 1993: "Permission to use,
// copy, modify, and distribute this software is freely granted, provided that this notice is
// preserved"): rational approximations on [0, 0.84375), [0.84375, 1.25), [1.25, 1/0.35),
// [1/0.35, 6), and ±1 beyond. Far more precise than the float32 results it feeds.
const ERX = 8.45062911510467529297e-1;
const PP = [
  1.28379167095512558561e-1, -3.25042107247001499370e-1, -2.84817495755985104766e-2, -5.77027029648944159157e-3, -2.37630166566501626084e-5,
];
const QQ = [
  1, 3.97917223959155352819e-1, 6.50222499887672944485e-2, 5.08130628187576562776e-3, 1.32494738004321644526e-4, -3.96022827877536812320e-6,
];
const PA = [
  -2.36211856075265944077e-3, 4.14856118683748331666e-1, -3.72207876035701323847e-1, 3.18346619901161753674e-1, -1.10894694282396677476e-1,
  3.54783043256182359371e-2, -2.16637559486879084300e-3,
];
const QA = [
  1, 1.06420880400844228286e-1, 5.40397917702171048937e-1, 7.18286544141962662868e-2, 1.26171219808761642112e-1, 1.36370839120290507362e-2,
  1.19844998467991074170e-2,
];
const RA = [
  -9.86494403484714822705e-3, -6.93858572707181764372e-1, -1.05586262253232909814e1, -6.23753324503260060396e1, -1.62396669462573470355e2,
  -1.84605092906711035994e2, -8.12874355063065934246e1, -9.81432934416914548592,
];
const SA = [
  1, 1.96512716674392571292e1, 1.37657754143519042600e2, 4.34565877475229228821e2, 6.45387271733267880336e2, 4.29008140027567833386e2,
  1.08635005541779435134e2, 6.57024977031928170135, -6.04244152148580987438e-2,
];
const RB = [
  -9.86494292470009928597e-3, -7.99283237680523006574e-1, -1.77579549177547519889e1, -1.60636384855821916062e2, -6.37566443368389627722e2,
  -1.02509513161107724954e3, -4.83519191608651397019e2,
];
const SB = [
  1, 3.03380607434824582924e1, 3.25792512996573918826e2, 1.53672958608443695994e3, 3.19985821950859553908e3, 2.55305040643316442583e3,
  4.74528541206955367215e2, -2.24409524465858183362e1,
];

/** c[0] + c[1] z + c[2] z² + … (Horner). */
function poly(c: readonly number[], z: number): number {
  let r = c[c.length - 1];
  for (let i = c.length - 2; i >= 0; i--) r = r * z + c[i];
  return r;
}

/** The error function in double precision. */
export function erf(x: number): number {
  if (Number.isNaN(x)) return x;
  const a = Math.abs(x);
  let r: number;
  if (a < 0.84375) {
    const z = x * x;
    return x + x * (poly(PP, z) / poly(QQ, z));
  }
  if (a < 1.25) {
    const s = a - 1;
    r = ERX + poly(PA, s) / poly(QA, s);
  } else if (a < 6) {
    const s = 1 / (a * a);
    const ratio = a < 1 / 0.35 ? poly(RA, s) / poly(SA, s) : poly(RB, s) / poly(SB, s);
    // erfc(a) = exp(−a² − 0.5625 + R/S) / a, with a split as z + (a − z) to keep the square exact (fdlibm's trick)
    const z = Math.fround(a);
    r = 1 - (Math.exp(-z * z - 0.5625) * Math.exp((z - a) * (z + a) + ratio)) / a;
  } else {
    r = 1;
  }
  return x < 0 ? -r : r;
}
