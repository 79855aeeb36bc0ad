import { isAdapterWeight } from '../models/index.ts';
import type { StageExecutor } from '../pipeline/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { createHash } from 'node:crypto';
import { hashArrays, hashNamed } from './hash.ts';

/** The hash of each executor's frozen weights (they never change: hashed once). */
const frozenHashes = new WeakMap<StageExecutor, string>();

/**
 * The sha256 of a section's weights, in its executor's order (the order re-execution rebuilds): those it trains, and a
 * frozen base (under an adapter) besides, hashed once.
 */
export function weightsHash(executor: StageExecutor): string {
  const trained = hashNamed(executor.named);
  if (executor.frozen.size === 0) return trained;
  let frozen = frozenHashes.get(executor);
  if (frozen === undefined) {
    frozen = hashNamed(executor.frozen);
    frozenHashes.set(executor, frozen);
  }
  return createHash('sha256').update(`trained:${trained};frozen:${frozen}`).digest('hex');
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

/**
 * The sha256 of the LoRA factors among `weights` (those named `…lora_A/B…`), in name order: what a user put on a job that
 * does not train (`setAdapter`), which an audit checks the factors its host hands over against.
 */
export function factorsHash(weights: Iterable<readonly [string, Tensor]>): string {
  return hashNamed([...weights].filter(([n]) => isAdapterWeight(n)).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}
