import { InvalidArgumentError } from '../errors.ts';
import { type CausalLM, countTargets, microBatchLoss, type TrainingBatch } from '../models/index.ts';
import { noGrad } from '../tensor/index.ts';

/**
 * Contribution scoring of data-parallel replicas' gradients: which replicas did the work, and
 * which rode free (sent nothing, a copy, an old gradient or noise).
 *
 * For replicas i = 1..n with gradients g_i, a held-out batch none of them trained on and a
 * plain SGD step of size lr:
 *
 *   ν             = median_{j ∈ C} ‖g_j‖                       the common step length
 *   improvement_i = L(w) − L(w − lr·ν·g_i/‖g_i‖)               the held-out loss the gradient removes
 *   agreement_i   = cos(g_i, Σ_{j ∈ C, j ≠ i} g_j)             0 when either side is zero
 *   score_i       = improvement_i / max_{j ∈ E} |improvement_j| + agreement_i     (in [−2, 2])
 *   score_i       = FLAGGED_SCORE (−3), below every attainable score, when i is flagged
 *
 * The first term is Templar's gradient score (tplr-ai/templar, `neurons/validator.py` l.1843 at
 * c2397ac; once `compute_improvement_metrics` in tplr/evaluation.py: the validator applies a
 * miner's gradient and scores loss before − loss after on a batch the miner did not pick), normalised by the round's largest improvement so
 * that it does not depend on the loss's scale or on lr. Every gradient is stepped at the same
 * length ν, as Templar's sign step is blind to a gradient's scale: a replica cannot score more
 * by inflating its gradient, nor less for a batch with a small loss; what counts is the
 * direction. The second term is agreement: the cosine of a gradient with the sum (the direction
 * of the mean) of the others': about 0 for noise, low for a gradient of weights far behind.
 *
 * Flagged (never trusted, forced to the bottom): a zero gradient; a gradient with a non-finite
 * value, or whose step makes the held-out loss non-finite (improvement −∞); and a duplicate,
 * a gradient bit-identical to another replica's. The copy cannot be told from its original, so
 * every member of an identical group is flagged (a protocol that commits to a hash of each
 * gradient before any is revealed keeps an honest replica from being copied). C, the replicas
 * whose gradients form the consensus, is every replica that is neither zero, non-finite nor a
 * duplicate; E, over which improvements are normalised, is C less those with a non-finite loss.
 * A gradient the replica computed honestly but at weights a few steps old, while the model's
 * gradient hardly turns, is as useful as a fresh one and scores like one: only one far enough
 * behind to point elsewhere scores low.
 *
 * A parameter missing from a replica's map counts as a zero gradient for it.
 */

/** Parameter name → gradient values (the names of `model.namedParameters()`). */
export interface ReplicaGradients {
  peer: string;
  grads: Map<string, Float32Array>;
}

export interface ContributionScore {
  peer: string;
  /** Held-out loss before − after an SGD step with this gradient at the common length ν (−∞ when not finite). */
  improvement: number;
  /** Cosine with the sum of the other (unflagged) replicas' gradients, in [−1, 1]. */
  agreement: number;
  /** Bit-identical to another replica's gradients. */
  duplicate: boolean;
  score: number;
}

/** The score of a flagged replica: below the lowest attainable score (−1 − 1). */
export const FLAGGED_SCORE = -3;

/** The parameter names of any replica, sorted, each with its length (checked to agree). */
function layout(replicas: readonly ReplicaGradients[]): Map<string, number> {
  const lengths = new Map<string, number>();
  for (const r of replicas) {
    for (const [name, g] of r.grads) {
      const known = lengths.get(name);
      if (known === undefined) lengths.set(name, g.length);
      else if (known !== g.length) {
        throw new InvalidArgumentError(`peer ${r.peer}: gradient of '${name}' has ${g.length} values, another replica's ${known}`, {
          details: { peer: r.peer, name, got: g.length, expected: known },
        });
      }
    }
  }
  return new Map([...lengths].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

function dot(a: Map<string, Float32Array>, b: Map<string, Float32Array>): number {
  let s = 0;
  for (const [name, x] of a) {
    const y = b.get(name);
    if (y === undefined) continue;
    if (y.length !== x.length) throw new InvalidArgumentError(`gradients of '${name}' differ in length: ${x.length} and ${y.length}`);
    for (let k = 0; k < x.length; k++) s += x[k] * y[k];
  }
  return s;
}

/**
 * The cosine similarity of two gradients (a missing parameter counts as zeros), accumulated in
 * float64; 0 when either is zero.
 *
 * @example
 * cosineSimilarity(new Map([['w', new Float32Array([1, 0])]]), new Map([['w', new Float32Array([1, 1])]])) // ≈ 0.7071
 */
export function cosineSimilarity(a: Map<string, Float32Array>, b: Map<string, Float32Array>): number {
  const na = Math.sqrt(dot(a, a));
  const nb = Math.sqrt(dot(b, b));
  if (na === 0 || nb === 0) return 0;
  return Math.max(-1, Math.min(1, dot(a, b) / (na * nb)));
}

/** Bits of a float32 array, so that −0 ≠ +0 and NaNs compare by payload. */
function bits(x: Float32Array): Uint32Array {
  return new Uint32Array(x.buffer, x.byteOffset, x.length);
}

const ZEROS = new Float32Array(0);

/** Values of `name` in a replica's map, or zeros (length 0 stands for "all zeros"). */
function valuesOf(r: ReplicaGradients, name: string): Float32Array {
  return r.grads.get(name) ?? ZEROS;
}

function sameBits(a: ReplicaGradients, b: ReplicaGradients, names: Map<string, number>): boolean {
  for (const [name, length] of names) {
    const x = bits(valuesOf(a, name));
    const y = bits(valuesOf(b, name));
    for (let k = 0; k < length; k++) if ((x.length === 0 ? 0 : x[k]) !== (y.length === 0 ? 0 : y[k])) return false;
  }
  return true;
}

/** FNV-1a over the bits of every parameter in `names`' order (missing ones as zeros). */
function fingerprint(r: ReplicaGradients, names: Map<string, number>): number {
  let h = 0x811c9dc5;
  for (const [name, length] of names) {
    const x = bits(valuesOf(r, name));
    for (let k = 0; k < length; k++) {
      h ^= x.length === 0 ? 0 : x[k];
      h = Math.imul(h, 0x01000193) >>> 0;
    }
  }
  return h;
}

/**
 * Groups of replicas (indices into `replicas`, ascending) whose gradients are bit-identical,
 * only groups of two or more. A parameter missing from one map equals an all-(+0) one in another.
 *
 * @example
 * duplicateGroups([a, b, copyOfA, c]) // [[0, 2]]
 */
export function duplicateGroups(replicas: readonly ReplicaGradients[]): number[][] {
  const names = layout(replicas);
  const byPrint = new Map<number, number[]>();
  replicas.forEach((r, i) => {
    const h = fingerprint(r, names);
    byPrint.set(h, [...(byPrint.get(h) ?? []), i]);
  });
  const groups: number[][] = [];
  for (const candidates of byPrint.values()) {
    // a hash collision must not make two different gradients duplicates: compare bit by bit
    const left = [...candidates];
    while (left.length > 1) {
      const first = left.shift()!;
      const same = left.filter((j) => sameBits(replicas[first], replicas[j], names));
      if (same.length > 0) groups.push([first, ...same]);
      for (const j of same) left.splice(left.indexOf(j), 1);
    }
  }
  return groups.sort((a, b) => a[0] - b[0]);
}

/**
 * The median of some numbers (the mean of the middle two for an even count); undefined for none.
 * @example
 * median([3, 1, 2, 10]) // 2.5
 */
export function median(values: number[]): number | undefined {
  if (values.length === 0) return undefined;
  const v = [...values].sort((x, y) => x - y);
  const m = v.length >> 1;
  return v.length % 2 === 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

/** g · factor (g itself for a factor of 1). */
function rescaled(grads: Map<string, Float32Array>, factor: number): Map<string, Float32Array> {
  if (factor === 1) return grads;
  return new Map([...grads].map(([name, g]) => [name, Float32Array.from(g, (x) => x * factor)]));
}

function isZero(grads: Map<string, Float32Array>): boolean {
  for (const g of grads.values()) for (let k = 0; k < g.length; k++) if (g[k] !== 0) return false;
  return true;
}

function isFiniteGradient(grads: Map<string, Float32Array>): boolean {
  for (const g of grads.values()) for (let k = 0; k < g.length; k++) if (!Number.isFinite(g[k])) return false;
  return true;
}

/**
 * Scores each replica's gradient by the held-out loss it removes and by its agreement with the
 * others (the formula is in this file's header comment); free riders score below honest replicas.
 * Scores are in the order of `replicas`. `lossAfter` is called once per distinct, non-zero,
 * finite gradient, with that gradient rescaled to the common length ν, the replica's index and
 * the factor it was rescaled by (ν/‖g_i‖: a caller that holds the gradient elsewhere, as a job
 * whose replicas hold their own changes, applies it there).
 *
 * @param lossBefore the held-out loss at the current weights
 * @param lossAfter the held-out loss after a plain SGD step w − lr·g (see {@link heldOutLossAfter}), deterministic
 * @example
 * const scores = scoreContributions(replicas, heldOutLoss(model, batch), heldOutLossAfter(model, batch, 0.1));
 * const paid = scores.filter((s) => s.score > 0);
 */
export function scoreContributions(
  replicas: ReplicaGradients[],
  lossBefore: number,
  lossAfter: (grads: Map<string, Float32Array>, index: number, factor: number) => number,
): ContributionScore[] {
  const peers = new Set(replicas.map((r) => r.peer));
  if (peers.size !== replicas.length) throw new InvalidArgumentError('a peer appears twice among the replicas');
  if (!Number.isFinite(lossBefore)) throw new InvalidArgumentError(`the loss before the step is ${lossBefore}`);
  const n = replicas.length;
  const groups = duplicateGroups(replicas);
  const groupOf = new Array<number>(n).fill(-1);
  groups.forEach((g, gi) => g.forEach((i) => (groupOf[i] = gi)));
  const zero = replicas.map((r) => isZero(r.grads));
  const finite = replicas.map((r) => isFiniteGradient(r.grads));

  const consensus = replicas.map((_, i) => groupOf[i] < 0 && !zero[i] && finite[i]);

  // held-out improvement of a step of the common length, evaluated once per distinct gradient
  const norms = replicas.map((r, i) => (finite[i] ? Math.sqrt(dot(r.grads, r.grads)) : 0));
  const common = median(norms.filter((_, i) => consensus[i])) ?? median(norms.filter((x) => x > 0));
  const improvement = new Array<number>(n).fill(0);
  const groupImprovement = new Map<number, number>();
  for (let i = 0; i < n; i++) {
    if (!finite[i]) improvement[i] = Number.NEGATIVE_INFINITY;
    else if (zero[i]) improvement[i] = 0;
    else {
      let value = groupImprovement.get(groupOf[i]);
      if (value === undefined) {
        const factor = common! / norms[i];
        value = lossBefore - lossAfter(rescaled(replicas[i].grads, factor), i, factor);
        if (!Number.isFinite(value)) value = Number.NEGATIVE_INFINITY;
        if (groupOf[i] >= 0) groupImprovement.set(groupOf[i], value);
      }
      improvement[i] = value;
    }
  }

  // agreement with the consensus of the unflagged others
  const names = layout(replicas);
  const sum = new Map<string, Float64Array>();
  for (const [name, length] of names) {
    const s = new Float64Array(length);
    for (let i = 0; i < n; i++) {
      const g = replicas[i].grads.get(name);
      if (consensus[i] && g !== undefined) for (let k = 0; k < length; k++) s[k] += g[k];
    }
    sum.set(name, s);
  }
  const agreement = replicas.map((r, i) => {
    if (zero[i] || !finite[i]) return 0;
    let d = 0;
    let nOthers = 0;
    let nSelf = 0;
    for (const [name, s] of sum) {
      const g = r.grads.get(name);
      for (let k = 0; k < s.length; k++) {
        const x = g === undefined ? 0 : g[k];
        const o = consensus[i] ? s[k] - x : s[k];
        d += x * o;
        nOthers += o * o;
        nSelf += x * x;
      }
    }
    if (nOthers === 0 || nSelf === 0) return 0;
    return Math.max(-1, Math.min(1, d / Math.sqrt(nSelf * nOthers)));
  });

  const eligible = consensus.map((c, i) => c && Number.isFinite(improvement[i]));
  const scale = Math.max(0, ...improvement.filter((_, i) => eligible[i]).map(Math.abs));
  return replicas.map((r, i) => ({
    peer: r.peer,
    improvement: improvement[i],
    agreement: agreement[i],
    duplicate: groupOf[i] >= 0,
    score: eligible[i] ? (scale > 0 ? improvement[i] / scale : 0) + agreement[i] : FLAGGED_SCORE,
  }));
}

/** The mean cross-entropy of `model` on `batch` (targets −100 ignored), in eval mode, without autograd. */
export function heldOutLoss(model: CausalLM, batch: TrainingBatch): number {
  const training = model.training;
  model.eval();
  try {
    return noGrad(() => microBatchLoss(model.forward(batch.input), batch.target, countTargets(batch.target)).item());
  } finally {
    model.train(training);
  }
}

/**
 * The held-out loss after a plain SGD step: for a gradient map, the loss of `model` on `batch`
 * with its weights set to w − lr·g (rounded to float32), without changing the model: each
 * stepped parameter's storage is swapped for a new array and the original array put back
 * afterwards, so the weights are restored bit for bit (even when the forward throws).
 * Names are those of `model.namedParameters()` (a tied weight under its first name); a
 * parameter missing from the map does not move.
 *
 * @example
 * const after = heldOutLossAfter(model, heldOut, 0.1);
 * scoreContributions(replicas, heldOutLoss(model, heldOut), after);
 */
export function heldOutLossAfter(model: CausalLM, batch: TrainingBatch, lr: number): (grads: Map<string, Float32Array>) => number {
  if (!(lr > 0) || !Number.isFinite(lr)) throw new InvalidArgumentError(`the step size must be a positive number, got ${lr}`);
  const params = new Map(model.namedParameters());
  return (grads) => {
    for (const [name, g] of grads) {
      const p = params.get(name);
      if (p === undefined) throw new InvalidArgumentError(`the model has no parameter '${name}'`, { details: { name } });
      if (p.dtype !== 'float32') throw new InvalidArgumentError(`'${name}' is ${p.dtype}, not float32`, { details: { name } });
      if (g.length !== p.size) {
        throw new InvalidArgumentError(`gradient of '${name}' has ${g.length} values, the parameter ${p.size}`, {
          details: { name, got: g.length, expected: p.size },
        });
      }
    }
    const saved: [string, Float32Array][] = [];
    try {
      for (const [name, g] of grads) {
        const p = params.get(name)!;
        const w = p.data as Float32Array;
        const stepped = new Float32Array(w.length);
        for (let k = 0; k < w.length; k++) stepped[k] = w[k] - lr * g[k];
        saved.push([name, w]);
        p.data = stepped;
      }
      return heldOutLoss(model, batch);
    } finally {
      for (const [name, w] of saved) params.get(name)!.data = w;
    }
  };
}
