import { type Linear, Module, ModuleList } from '../nn/index.ts';
import { cat, compositeOp, type Generator, gather, indexSelect, softmax, type Tensor, tensor } from '../tensor/index.ts';
import { proj } from './decoder-parts.ts';

/**
 * The MLPs of the sparse mixture-of-experts families, as transformers 5.17
 * computes them: a SwiGLU MLP under a family's names for its three matrices, and the sparse MoE
 * block: a router (`gate`, hidden → experts, no bias) whose softmax (float32) picks each token's
 * top-k experts, the picked probabilities renormalised to sum to 1 (always, or as the family's
 * with norm_topk_prob), and the token's output the sum of its experts' outputs, each scaled by
 * its weight, added in the order of the experts' indices (transformers' index_add_ over the
 * experts hit, from zeros). Every expert of a layer is a separate module under the checkpoint's
 * names (`experts.3.w1`): transformers fuses them at run time, the checkpoints do not.
 */

/** A SwiGLU MLP's three matrices by their checkpoint names (some families' experts: w1, w3, w2). */
export interface GatedMLPNames {
  gate: string;
  up: string;
  down: string;
}

/** The names the shared decoder's MLP (and experts named as it) has. */
export const PROJ_NAMES: GatedMLPNames = { gate: 'gate_proj', up: 'up_proj', down: 'down_proj' };

/** down(silu(gate(x)) · up(x)), without biases. */
export class GatedMLP extends Module {
  readonly gate: Linear;
  readonly up: Linear;
  readonly down: Linear;
  constructor(hidden: number, width: number, names: GatedMLPNames, c: { initializerRange: number }, rng: Generator) {
    super();
    this.gate = this.addModule(names.gate, proj(hidden, width, false, c, rng));
    this.up = this.addModule(names.up, proj(hidden, width, false, c, rng));
    this.down = this.addModule(names.down, proj(width, hidden, false, c, rng));
  }

  forward(x: Tensor): Tensor {
    return this.down.forward(this.gate.forward(x).silu().mul(this.up.forward(x)));
  }
}

/** What a sparse MoE block is: its sizes, its routing, its experts' names. */
export interface MoeSpec {
  hidden: number;
  /** Each expert's SwiGLU width. */
  width: number;
  experts: number;
  /** Experts per token (num_experts_per_tok). */
  topK: number;
  /** Renormalise the top-k probabilities to sum to 1 (norm_topk_prob, or always). */
  normTopK: boolean;
  names: GatedMLPNames;
  initializerRange: number;
}

/** The sizes of a sparse MoE block: every expert's parameters, and the FLOPs per token of the router and the top-k experts it runs. */
export function moeSizes(s: MoeSpec): { params: number; flopsPerToken: number } {
  const expert = 3 * s.hidden * s.width;
  const router = s.hidden * s.experts;
  return { params: router + s.experts * expert, flopsPerToken: 2 * (router + s.topK * expert) };
}

/**
 * Each row's `k` largest of `n` values, largest first (ties: the lower index first), as
 * torch.topk: int32 [rows · k].
 */
export function topKIndices(values: ArrayLike<number>, rows: number, n: number, k: number): Int32Array {
  const out = new Int32Array(rows * k);
  const order = Array.from({ length: n }, (_, i) => i);
  for (let r = 0; r < rows; r++) {
    const base = r * n;
    order.sort((a, b) => values[base + b] - values[base + a] || a - b);
    for (let j = 0; j < k; j++) out[r * k + j] = order[j];
    for (let i = 0; i < n; i++) order[i] = i;
  }
  return out;
}

/** The sparse MoE block: `gate` (the router) and `experts.0` … `experts.E−1`. */
export class SparseMoe extends Module {
  readonly gate: Linear;
  readonly experts: ModuleList<GatedMLP>;
  constructor(
    readonly spec: MoeSpec,
    rng: Generator,
  ) {
    super();
    this.gate = this.addModule('gate', proj(spec.hidden, spec.experts, false, spec, rng));
    this.experts = this.addModule(
      'experts',
      new ModuleList(Array.from({ length: spec.experts }, () => new GatedMLP(spec.hidden, spec.width, spec.names, spec, rng))),
    );
  }

  forward(x: Tensor): Tensor {
    const [b, t, h] = x.shape;
    const flat = x.reshape([b * t, h]); // [N, H]
    const probs = softmax(this.gate.forward(flat), -1); // [N, E]
    return routedExperts(this, flat, probs).reshape([b, t, h]); // [B, T, H]
  }
}

/**
 * The routed part of a sparse MoE block: each token of `flat` [N, H] sent to the top-k experts of its router
 * probabilities `probs` [N, E] (picked on the host), their outputs weighted and summed: [N, H]. One public op
 * (compositeOp), so that a traced step records it whole and a replay picks the experts again from its new inputs;
 * the block's experts are read at each call.
 * @example
 * const y = routedExperts(moe, flat, softmax(moe.gate.forward(flat), -1)) // [N, H]
 */
export const routedExperts = compositeOp('routedExperts', (moe: SparseMoe, flat: Tensor, probs: Tensor): Tensor => {
  const { experts, topK: k } = moe.spec;
  const n = flat.shape[0];
  const picked = topKIndices(probs.data, n, experts, k); // [N · k], largest first
  let weights = gather(probs, 1, tensor(picked, [n, k], 'int32')); // [N, k]
  if (moe.spec.normTopK) weights = weights.div(weights.sum(-1, true));
  const slotWeights = weights.reshape([n * k, 1]); // [N · k, 1]: slot s = token · k + rank

  // each expert hit runs on its tokens (in transformers' order: by rank, then token); its rows
  // of the outputs are `rowOf` each slot
  const outputs: Tensor[] = [];
  const rowOf = new Int32Array(n * k);
  let rows = 0;
  for (let e = 0; e < experts; e++) {
    const slots: number[] = [];
    for (let j = 0; j < k; j++) for (let i = 0; i < n; i++) if (picked[i * k + j] === e) slots.push(i * k + j);
    if (slots.length === 0) continue;
    const tokens = tensor(Int32Array.from(slots, (s) => Math.floor(s / k)), [slots.length], 'int32');
    const y = moe.experts.at(e).forward(indexSelect(flat, 0, tokens)); // [n_e, H]
    outputs.push(y.mul(indexSelect(slotWeights, 0, tensor(Int32Array.from(slots), [slots.length], 'int32'))));
    slots.forEach((s, i) => (rowOf[s] = rows + i));
    rows += slots.length;
  }
  const all = outputs.length === 1 ? outputs[0] : cat(outputs, 0); // [N · k, H]

  // a token's output: its experts' rows added in the order of the experts' indices
  const terms = Array.from({ length: k }, () => new Int32Array(n));
  for (let i = 0; i < n; i++) {
    const ranks = Array.from({ length: k }, (_, j) => j).sort((p, q) => picked[i * k + p] - picked[i * k + q]);
    ranks.forEach((j, m) => (terms[m][i] = rowOf[i * k + j]));
  }
  let out = indexSelect(all, 0, tensor(terms[0], [n], 'int32'));
  for (let m = 1; m < k; m++) out = out.add(indexSelect(all, 0, tensor(terms[m], [n], 'int32')));
  return out; // [N, H]
});
