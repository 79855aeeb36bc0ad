import type { Tensor } from '../../tensor.ts';
import { SlotRef, type TracedStep } from '../../trace.ts';
import { CannotLower, type GraphBuilder, type GraphValue } from './builder.ts';
import { differentiate } from './gradients.ts';

/**
 * `loss.backward()` inside a traced step, written into the step's graph: the gradient of the loss with respect to each
 * parameter the step reads (a constant leaf that requires a gradient), by reverse mode over the nodes written so far
 * (gradients.ts). The gradients become extra outputs of the graph, which the backend that runs it adds into each
 * parameter's `.grad`, as backward does: a forward and backward step is one graph. An optimizer's step in the same
 * trace is not lowered yet (the step then replays op by op).
 */

/** Ops whose lowering stores the weights of a module it is given (model-ops.ts' routedExperts): no gradient reaches them. */
const HIDDEN_WEIGHTS = new Set(['routedExperts']);

/** The gradients a step's graph adds into its parameters' `.grad`, by parameter. */
export type StepGradients = Map<Tensor, GraphValue>;

/** Lowers one traced `backward` call (args: the loss, its gradient or nothing, options); returns why not, or null. */
export function lowerBackward(
  g: GraphBuilder,
  args: readonly unknown[],
  values: readonly (GraphValue | undefined)[],
  step: TracedStep,
  gradients: StepGradients,
): string | null {
  // a mixture's experts are a module the lowering reads whole (stored in the graph): the step does not see their weights
  const hidden = step.ops.find((o) => HIDDEN_WEIGHTS.has(o.op));
  if (hidden !== undefined) return `backward through '${hidden.op}', whose weights are stored in the graph, is not lowered`;
  const [root, seed] = args;
  if (!(root instanceof SlotRef)) return 'backward of something else than a value of the step';
  const loss = values[root.slot]!;
  let dy: GraphValue;
  if (seed instanceof SlotRef) dy = values[seed.slot]!;
  else if (seed === undefined || seed === null) dy = g.node('Expand', [g.scalar(1), g.ints(loss.shape)], { shape: loss.shape, type: loss.type });
  else return 'backward with a gradient that is not a value of the step';
  const params: Tensor[] = [];
  const wrt: GraphValue[] = [];
  for (const [i, s] of step.slots.entries()) {
    const t = s.tensor;
    if (s.kind !== 'constant' || t === null || !t.requiresGrad || t.node !== null || s.dtype !== 'float32') continue;
    params.push(t);
    wrt.push(values[i]!);
  }
  let grads: (GraphValue | null)[];
  try {
    grads = differentiate(g, wrt, [[loss, dy]]);
  } catch (err) {
    if (err instanceof CannotLower) return `backward: ${err.message}`;
    throw err;
  }
  grads.forEach((grad, i) => {
    if (grad === null) return;
    const before = gradients.get(params[i]);
    gradients.set(params[i], before === undefined ? grad : g.node('Add', [before, grad]));
  });
  return null;
}
