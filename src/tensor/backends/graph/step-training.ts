import { TraceError } from '../../../errors.ts';
import { addInto } from '../../kernels/rows.ts';
import { Tensor } from '../../tensor.ts';
import { SlotRef, type TracedStep } from '../../trace.ts';
import { CannotLower, type GraphBuilder, GraphValue } from './builder.ts';
import { differentiate } from './gradients.ts';

/**
 * The training ops of a traced step written into its graph, so that a training step (forward, `loss.backward()`, an
 * optimizer's `step()`, `zeroGrad()`) is one graph:
 * - `backward`: the gradient of the loss with respect to each parameter the step reads (a constant leaf that requires
 *   a gradient), by reverse mode over the nodes written so far (gradients.ts);
 * - `optimizerStep`: an optimizer that has a graph form (GraphOptimizer: AdamW) updates each parameter that has a
 *   gradient; the new parameters and moments are outputs that the backend writes back in place, and the step's
 *   hyper-parameters (learning rate, bias corrections) are host values computed before each run;
 * - `zeroGrad` and `releaseGrads`: the gradients are dropped.
 * Gradients still held at the end of the step are outputs that the backend adds into each parameter's `.grad`, as
 * backward does.
 */

/**
 * What an optimizer gives a graph to write its update (nn/optim's AdamW implements it): for a parameter, its moment
 * buffers and a function that advances its step count and gives this step's scalars, [decay, β₁, 1 − β₁, β₂, 1 − β₂,
 * lr / (1 − β₁ᵗ), √(1 − β₂ᵗ), ε] (AdamW as PyTorch's: p ← p·decay − lr/(1−β₁ᵗ) · m / (√v / √(1−β₂ᵗ) + ε)); null for a
 * parameter or an optimizer without a graph form.
 */
export interface GraphOptimizer {
  readonly params: readonly Tensor[];
  adamwGraph(p: Tensor): { m: Float32Array; v: Float32Array; scalars: () => Float32Array } | null;
}

/** A host value the runner computes before each run and feeds. */
export interface HostFeed {
  name: string;
  shape: readonly number[];
  value: () => Float32Array;
}

/** Where an output goes after a run: added into a parameter's `.grad`, or written over a parameter or a state buffer. */
export interface TrainingOutput {
  value: GraphValue;
  kind: 'grad' | 'write';
  target: Tensor | Float32Array;
}

const isOptimizer = (o: unknown): o is GraphOptimizer =>
  typeof o === 'object' && o !== null && typeof (o as GraphOptimizer).adamwGraph === 'function';

/** Ops whose lowering stores the weights of a module it is given (model-ops.ts' routedExperts): no gradient reaches them. */
const HIDDEN_WEIGHTS = new Set(['routedExperts']);

/** The training ops' part of one step's lowering (step-graph.ts calls it for the ops in TRAINING_OPS). */
export class StepTraining {
  static readonly OPS: ReadonlySet<string> = new Set(['backward', 'optimizerStep', 'zeroGrad', 'releaseGrads']);
  private readonly gradients = new Map<Tensor, GraphValue>();
  private readonly writes: TrainingOutput[] = [];
  readonly feeds: HostFeed[] = [];
  /** Tensors and buffers the graph reads besides the step's slots (moments), by graph input name. */
  readonly extraInputs: { value: GraphValue; source: Float32Array }[] = [];

  constructor(
    private readonly g: GraphBuilder,
    private readonly values: readonly (GraphValue | undefined)[],
    private readonly step: TracedStep,
  ) {}

  /** Lowers one training op; returns why not, or null. */
  lower(op: string, args: readonly unknown[]): string | null {
    try {
      if (op === 'backward') return this.backward(args);
      if (op === 'optimizerStep') return this.optimizerStep(args[0]);
      this.gradients.clear();
      return null;
    } catch (err) {
      if (err instanceof CannotLower) return `${op}: ${err.message}`;
      throw err;
    }
  }

  /** The outputs the runner handles after each run: gradients left (into .grad), then writes. */
  outputs(): TrainingOutput[] {
    const grads = [...this.gradients].map(([target, value]): TrainingOutput => ({ value, kind: 'grad', target }));
    return [...grads, ...this.writes];
  }

  private backward(args: readonly unknown[]): string | null {
    const hidden = this.step.ops.find((o) => HIDDEN_WEIGHTS.has(o.op));
    if (hidden !== undefined) return `backward through '${hidden.op}', whose weights are stored in the graph, is not lowered`;
    const { g, values } = this;
    const [root, seed] = args;
    if (!(root instanceof SlotRef)) return 'backward of something else than a value of the step';
    const loss = values[root.slot]!;
    let dy: GraphValue;
    if (seed instanceof SlotRef) dy = values[seed.slot]!;
    else if (seed === undefined || seed === null) dy = g.node('Expand', [g.scalar(1), g.ints(loss.shape)], { shape: loss.shape, type: loss.type });
    else return 'backward with a gradient that is not a value of the step';
    const params: Tensor[] = [];
    const wrt: GraphValue[] = [];
    for (const [i, s] of this.step.slots.entries()) {
      const t = s.tensor;
      if (s.kind !== 'constant' || t === null || !t.requiresGrad || t.node !== null || s.dtype !== 'float32') continue;
      params.push(t);
      wrt.push(values[i]!);
    }
    differentiate(g, wrt, [[loss, dy]]).forEach((grad, i) => {
      if (grad === null) return;
      const before = this.gradients.get(params[i]);
      this.gradients.set(params[i], before === undefined ? grad : g.node('Add', [before, grad]));
    });
    return null;
  }

  private optimizerStep(opt: unknown): string | null {
    if (!isOptimizer(opt)) return 'an optimizer without a graph form (AdamW has one)';
    const { g } = this;
    const slotOf = new Map(this.step.slots.flatMap((s, i) => (s.kind === 'constant' && s.tensor ? [[s.tensor, i] as const] : [])));
    for (const p of opt.params) {
      const grad = this.gradients.get(p);
      if (grad === undefined) continue;
      const state = opt.adamwGraph(p);
      const slot = slotOf.get(p);
      if (state === null || slot === undefined) return 'a parameter without a graph form of its update';
      const id = this.feeds.length;
      const scalars = g.know(new GraphValue(`adam_h${id}`, [8], 'float32'));
      this.feeds.push({
        name: scalars.name,
        shape: [8],
        value: () => {
          if (p.grad !== null) throw new TraceError('a compiled training step runs with gradients cleared: call zeroGrad() before it');
          return state.scalars();
        },
      });
      const [m, v] = (['m', 'v'] as const).map((k) => {
        const value = g.know(new GraphValue(`adam_${k}${id}`, p.shape, 'float32'));
        this.extraInputs.push({ value, source: state[k] });
        return value;
      });
      const one = { shape: [1], type: 'float32' as const };
      const [decay, b1, c1, b2, c2, stepSize, bc2, eps] = g.multi('Split', [scalars], Array.from({ length: 8 }, () => one), { axis: 0 });
      const param = this.values[slot]!;
      const mul = (a: GraphValue, b: GraphValue) => g.node('Mul', [a, b], { shape: p.shape });
      const add = (a: GraphValue, b: GraphValue) => g.node('Add', [a, b], { shape: p.shape });
      const m2 = add(mul(m, b1), mul(grad, c1));
      const v2 = add(mul(v, b2), mul(mul(grad, grad), c2));
      const denom = add(g.node('Div', [g.node('Sqrt', [v2]), bc2], { shape: p.shape }), eps);
      const p2 = g.node('Sub', [mul(param, decay), g.node('Div', [mul(m2, stepSize), denom], { shape: p.shape })], { shape: p.shape });
      this.writes.push({ value: p2, kind: 'write', target: p }, { value: m2, kind: 'write', target: state.m }, { value: v2, kind: 'write', target: state.v });
    }
    return null;
  }
}

/**
 * Applies a training step's outputs on the host after a run (the ort backend; webgpu for host parameters): each
 * gradient added into its parameter's `.grad`, each new value written over its parameter or state buffer.
 */
export function applyTrainingOutputs(
  outputs: readonly { kind: 'grad' | 'write'; target: Tensor | Float32Array; shape: readonly number[] }[],
  values: readonly Float32Array[],
): void {
  outputs.forEach(({ kind, target, shape }, i) => {
    const value = values[i];
    if (kind === 'write') (target instanceof Float32Array ? target : (target.data as Float32Array)).set(value);
    else if (target instanceof Tensor) {
      if (target.grad === null) target.grad = new Tensor(value, [...shape]);
      else addInto(target.grad.data as Float32Array, value);
    }
  });
}
