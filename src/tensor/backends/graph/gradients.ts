import type { NodeSpec } from '../ort/onnx-graph.ts';
import { type GraphBuilder, type GraphValue, refuse } from './builder.ts';
import { GRADIENT_RULES } from './gradient-rules.ts';

/**
 * Reverse-mode differentiation of a lowered graph (after ONNX's and onnxruntime-training's gradient builders): the
 * nodes a lowering wrote are walked backwards from the seeds (an output and its gradient), and each node that depends
 * on a value to differentiate adds the nodes of its vector-Jacobian product (gradient-rules.ts, one rule per ONNX op
 * type). Every op of the engine that has a lowering gets its gradient this way, on every backend that runs the
 * graphs: a device backend's backward (webgpu) and a training step compiled as one graph need no second set of
 * kernels. An op type without a rule, or a gradient through a compact weight, is refused (CannotLower) with its name.
 */

/** Float types carry gradients; integer and boolean values (indices, masks, shapes) do not. */
const isFloat = (v: GraphValue): boolean => v.type === 'float32' || v.type === 'float64';

/** ONNX ops whose outputs never carry a gradient (they compare, pick indices or make shapes). */
const NOT_DIFFERENTIABLE = new Set(['Equal', 'Less', 'Greater', 'ArgMax', 'Range', 'Shape', 'Not', 'And', 'Or', 'OneHot']);

/** What a gradient rule is given: the node, its inputs and outputs as values, the outputs' gradients and which inputs need one. */
export interface GradientContext {
  readonly node: NodeSpec;
  readonly inputs: readonly (GraphValue | null)[];
  readonly outputs: readonly GraphValue[];
  /** The gradient of each output (null where nothing downstream needs it). */
  readonly grads: readonly (GraphValue | null)[];
  /** Which inputs need a gradient. */
  readonly needs: readonly boolean[];
}

/** A rule: the gradient of each input (null where none is needed or there is none). */
export type GradientRule = (g: GraphBuilder, c: GradientContext) => (GraphValue | null)[];

/**
 * Adds to `g` the gradients of the seeds' values with respect to each of `wrt`, through the nodes from index `from`
 * on: for each wrt value its gradient, or null where no seed depends on it.
 * @example
 * const y = lowering(g, x)                                   // forward nodes
 * const [gx] = differentiate(g, [x], [[y, gy]])              // gx = (dy/dx)ᵀ · gy, as nodes of g
 */
export function differentiate(
  g: GraphBuilder,
  wrt: readonly GraphValue[],
  seeds: readonly (readonly [GraphValue, GraphValue])[],
  from = 0,
): (GraphValue | null)[] {
  const forward = g.nodes.slice(from);
  // which values depend on a value to differentiate
  const depends = new Set(wrt.filter(isFloat).map((v) => v.name));
  for (const node of forward) {
    if (NOT_DIFFERENTIABLE.has(node.op) || !node.inputs.some((n) => depends.has(n))) continue;
    for (const out of node.outputs) if (isFloat(valueOf(g, out))) depends.add(out);
  }
  const grads = new Map<string, GraphValue>();
  const accumulate = (v: GraphValue, grad: GraphValue) => {
    const prev = grads.get(v.name);
    grads.set(v.name, prev === undefined ? grad : g.node('Add', [prev, grad], { shape: v.shape, type: v.type }));
  };
  for (const [v, grad] of seeds) if (depends.has(v.name)) accumulate(v, grad);
  for (let i = forward.length - 1; i >= 0; i--) {
    const node = forward[i];
    const outGrads = node.outputs.map((n) => grads.get(n) ?? null);
    if (outGrads.every((x) => x === null)) continue;
    const needs = node.inputs.map((n) => n !== '' && depends.has(n));
    if (!needs.some(Boolean)) continue;
    const rule = GRADIENT_RULES[node.op];
    if (rule === undefined || (node.domain !== undefined && node.domain !== '')) {
      refuse(`no gradient for ONNX ${node.domain ? `${node.domain}.` : ''}${node.op} (a compact weight is frozen: train a float copy or an adapter)`);
    }
    const inputs = node.inputs.map((n) => (n === '' ? null : valueOf(g, n)));
    const outputs = node.outputs.map((n) => valueOf(g, n));
    const inputGrads = rule(g, { node, inputs, outputs, grads: outGrads, needs });
    node.inputs.forEach((n, k) => {
      const ig = inputGrads[k];
      if (needs[k] && ig !== null && ig !== undefined) accumulate(inputs[k]!, ig);
    });
  }
  return wrt.map((v) => grads.get(v.name) ?? null);
}

function valueOf(g: GraphBuilder, name: string): GraphValue {
  const v = g.values.get(name);
  if (v === undefined) throw new Error(`graph value '${name}' is unknown to its builder (an input not told with know())`);
  return v;
}
