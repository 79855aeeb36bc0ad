import { InvalidArgumentError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { allocate, assertFloat } from '../dtype.ts';
import type { Generator } from '../random.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';

/**
 * Inverted dropout: zeroes each element with probability p and scales the rest by
 * 1/(1 − p). The mask comes from the given seeded generator, so a step replays
 * exactly (a validator re-executing it draws the same mask).
 */
export function dropout(x: Tensor, p: number, generator: Generator, training = true): Tensor {
  if (hooked) return hook('dropout', dropout, [x, p, generator, training]);
  if (p < 0 || p >= 1) throw new InvalidArgumentError(`dropout probability must be in [0, 1), got ${p}`);
  if (!training || p === 0) return x;
  assertFloat(x.dtype, 'dropout');
  const keep = new Uint8Array(x.size);
  const scale = 1 / (1 - p);
  const out = allocate(x.dtype, x.size);
  for (let i = 0; i < x.size; i++) {
    keep[i] = generator.uniform() >= p ? 1 : 0;
    out[i] = keep[i] ? x.data[i] * scale : 0;
  }
  return record(new Tensor(out, x.shape), 'dropout', [x], (g) => {
    const gx = allocate(x.dtype, x.size);
    for (let i = 0; i < gx.length; i++) gx[i] = keep[i] ? g.data[i] * scale : 0;
    return [new Tensor(gx, x.shape)];
  });
}
