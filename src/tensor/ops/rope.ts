import { ShapeMismatchError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { allocate, assertFloat } from '../dtype.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';

/**
 * Rotary position embedding in Hugging Face's rotate-half convention:
 * y = x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂, x₁] for the halves x₁, x₂ of the
 * head dim. x is [B, H, T, D]; cos and sin are [B or 1, T, D]. The gradient applies the
 * transposed rotation: gx = g·cos + [ (g·sin)₂, −(g·sin)₁ ].
 */
export function rotaryEmbedding(x: Tensor, cos: Tensor, sin: Tensor): Tensor {
  if (hooked) return hook('rotaryEmbedding', rotaryEmbedding, [x, cos, sin]);
  assertFloat(x.dtype, 'rotaryEmbedding');
  const [b, h, t, d] = x.shape;
  if (x.ndim !== 4 || d % 2 !== 0) throw new ShapeMismatchError(`rotaryEmbedding needs [B, H, T, even D], got [${x.shape}]`);
  const cb = cos.shape[0];
  if (cos.ndim !== 3 || cos.shape[1] !== t || cos.shape[2] !== d || (cb !== 1 && cb !== b)) {
    throw new ShapeMismatchError(`rotaryEmbedding: cos/sin [${cos.shape}] do not fit x [${x.shape}]`);
  }
  const half = d / 2;
  const src = x.data;
  const c = cos.data;
  const s = sin.data;
  const out = allocate(x.dtype, x.size);
  for (let bi = 0; bi < b; bi++) {
    for (let hi = 0; hi < h; hi++) {
      for (let ti = 0; ti < t; ti++) {
        const row = ((bi * h + hi) * t + ti) * d;
        const cs = ((cb === 1 ? 0 : bi) * t + ti) * d;
        for (let i = 0; i < half; i++) {
          const x1 = src[row + i];
          const x2 = src[row + i + half];
          out[row + i] = x1 * c[cs + i] - x2 * s[cs + i]; // y1 = x1 c1 − x2 s1
          out[row + i + half] = x2 * c[cs + i + half] + x1 * s[cs + i + half]; // y2 = x2 c2 + x1 s2
        }
      }
    }
  }
  return record(new Tensor(out, x.shape), 'rotaryEmbedding', [x], (g) => {
    const gx = allocate(x.dtype, x.size);
    // transpose of [[c1, −s1], [s2, c2]] per pair: gx1 = g1 c1 + g2 s2, gx2 = g2 c2 − g1 s1
    for (let bi = 0; bi < b; bi++) {
      for (let hi = 0; hi < h; hi++) {
        for (let ti = 0; ti < t; ti++) {
          const row = ((bi * h + hi) * t + ti) * d;
          const cs = ((cb === 1 ? 0 : bi) * t + ti) * d;
          for (let i = 0; i < half; i++) {
            const g1 = g.data[row + i];
            const g2 = g.data[row + i + half];
            gx[row + i] = g1 * c[cs + i] + g2 * s[cs + i + half];
            gx[row + i + half] = g2 * c[cs + i + half] - g1 * s[cs + i];
          }
        }
      }
    }
    return [new Tensor(gx, x.shape)];
  });
}
