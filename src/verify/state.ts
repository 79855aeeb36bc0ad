import type { StageExecutor } from '../pipeline/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { hashArrays, hashNamed } from './hash.ts';

/** The sha256 of a section's weights, in its executor's order (the order re-execution rebuilds). */
export function weightsHash(executor: StageExecutor): string {
  return hashNamed(executor.named);
}

/** The sha256 of AdamW's state of a section: each parameter's two moments and step count (none before its first step). */
export function optimizerHash(executor: StageExecutor): string {
  // the two moments in turn: the same bytes as the [2, ...shape] tensor `moments` copies them into
  return hashArrays([...executor.named.keys()].map((n) => {
    const m = executor.momentParts(n);
    return [n, m ? m.parts : null, m?.step ?? -1] as const;
  }));
}

/** The sha256 of one backward's contribution to the gradients, or of the gradients a step used (missing: none reached it). */
export function gradsHash(executor: StageExecutor, grads: ReadonlyMap<string, Tensor>): string {
  return hashNamed([...executor.named.keys()].map((n) => [n, grads.get(n) ?? null] as const));
}
