import { DTypeError, InvalidArgumentError, ShapeMismatchError } from '../../errors.ts';
import { record } from '../autograd.ts';
import { allocate } from '../dtype.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';
import { packedEmbedding } from './packed.ts';

/**
 * Row lookup: out[..., :] = weight[ids[...], :]. The gradient scatter-adds each
 * output row back into the row of the weight it came from.
 */
export function embedding(ids: Tensor, weight: Tensor): Tensor {
  if (hooked) return hook('embedding', embedding, [ids, weight]);
  if (ids.dtype !== 'int32') throw new DTypeError(`embedding ids must be int32, got ${ids.dtype}`);
  if (weight.packed !== null) return packedEmbedding(ids, weight);
  if (weight.ndim !== 2) throw new ShapeMismatchError(`embedding weight must be 2-D, got [${weight.shape}]`);
  const [vocab, dim] = weight.shape;
  const out = allocate(weight.dtype, ids.size * dim);
  for (let i = 0; i < ids.size; i++) {
    const id = ids.data[i];
    if (id < 0 || id >= vocab) {
      throw new InvalidArgumentError(`token id ${id} is outside the vocabulary of ${vocab}`);
    }
    out.set(weight.data.subarray(id * dim, (id + 1) * dim), i * dim);
  }
  return record(new Tensor(out, [...ids.shape, dim]), 'embedding', [weight], (g) => {
    const gw = allocate(weight.dtype, weight.size);
    for (let i = 0; i < ids.size; i++) {
      const to = ids.data[i] * dim;
      const from = i * dim;
      for (let j = 0; j < dim; j++) gw[to + j] += g.data[from + j];
    }
    return [new Tensor(gw, weight.shape)];
  });
}
