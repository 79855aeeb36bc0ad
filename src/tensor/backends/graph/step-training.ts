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

/**
 * Where an output goes after a run: added into a parameter's `.grad` ('grad'), put in place of it ('setGrad': the
 * step cleared it first), added into the `.grad` of the run's input `target` (an index among the step's inputs:
 * 'inputGrad', where that input requires a gradient), or written over a parameter or a state buffer ('write').
 */
export type TrainingTarget
  = | { kind: 'grad' | 'setGrad' | 'write'; target: Tensor | Float32Array }
    | { kind: 'inputGrad'; target: number };

type TrainingOutput = TrainingTarget & { value: GraphValue };

/** A training output of a lowered step: its graph output's name and shape, and where it goes. */
export type TrainingEntry = TrainingTarget & { name: string; shape: readonly number[] };

/** A parameter's gradient as the step leaves it: cleared by zeroGrad (to null or zeros) or not, and what backward added since. */
interface ParamGrad {
  cleared: boolean;
  setToNone: boolean;
  added: GraphValue | null;
}

/** What the runner does on the host around a run, besides feeding inputs and applying outputs. */
export interface HostEffects {
  /** Checks before a run: a state the graph cannot follow is a TraceError, before anything changed. */
  guards: (() => void)[];
  /** Gradients the step cleared and left cleared (zeroGrad last): set to null, or their values to zeros. */
  clears: { target: Tensor; setToNone: boolean }[];
}

const isOptimizer = (o: unknown): o is GraphOptimizer =>
  typeof o === 'object' && o !== null && typeof (o as GraphOptimizer).adamwGraph === 'function';

/** Ops whose lowering stores the weights of a module it is given (model-ops.ts' routedExperts): no gradient reaches them. */
const HIDDEN_WEIGHTS = new Set(['routedExperts']);

/** The training ops' part of one step's lowering (step-graph.ts calls it for the ops in StepTraining.OPS). */
export class StepTraining {
  static readonly OPS: ReadonlySet<string> = new Set(['backward', 'optimizerStep', 'zeroGrad', 'releaseGrads']);
  /** The parameters backward reached or zeroGrad cleared, and their gradients as the step has them so far. */
  private readonly grads = new Map<Tensor, ParamGrad>();
  /** The gradient of each float input of the step that a backward reached, by input index. */
  private readonly inputGradients = new Map<number, GraphValue>();
  /** Each parameter's moments as the step has them so far (after an update: its outputs). */
  private readonly moments = new Map<Tensor, { m: GraphValue; v: GraphValue }>();
  /** The last value written over each parameter and state buffer. */
  private readonly writes = new Map<Tensor | Float32Array, TrainingOutput>();
  readonly feeds: HostFeed[] = [];
  /** Tensors and buffers the graph reads besides the step's slots (moments), by graph input name. */
  readonly extraInputs: { value: GraphValue; source: Float32Array }[] = [];
  readonly effects: HostEffects = { guards: [], clears: [] };

  constructor(
    private readonly g: GraphBuilder,
    /** The step's values by slot: an optimizer's update replaces a parameter's, so later ops read the new one. */
    private readonly values: (GraphValue | undefined)[],
    private readonly step: TracedStep,
  ) {}

  /** Lowers one training op; returns why not, or null. */
  lower(op: string, args: readonly unknown[]): string | null {
    try {
      if (op === 'backward') return this.backward(args);
      const opt = args[0];
      if (!isOptimizer(opt)) return `${op} of an optimizer without a graph form (AdamW has one)`;
      if (op === 'optimizerStep') return this.optimizerStep(opt);
      // zeroGrad(setToNone) and releaseGrads(): the optimizer's parameters only, as eager clears them
      const setToNone = op === 'releaseGrads' || args[1] !== false;
      for (const p of opt.params) this.grads.set(p, { cleared: true, setToNone, added: null });
      return null;
    } catch (err) {
      if (err instanceof CannotLower) return `${op}: ${err.message}`;
      throw err;
    }
  }

  /** The outputs the runner handles after each run (gradients, input gradients, then writes); `effects` beside them. */
  outputs(): TrainingOutput[] {
    const grads: TrainingOutput[] = [];
    for (const [target, e] of this.grads) {
      if (e.added !== null) grads.push({ value: e.added, kind: e.cleared ? 'setGrad' : 'grad', target });
      else if (e.cleared) this.effects.clears.push({ target, setToNone: e.setToNone });
    }
    const inputs = [...this.inputGradients].map(([target, value]): TrainingOutput => ({ value, kind: 'inputGrad', target }));
    return [...grads, ...inputs, ...this.writes.values()];
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
      // after an optimizer's update in the same step, the parameter's value is the update's output
      wrt.push(values[i]!);
    }
    // the step's float inputs too: the runner adds their gradients into the run's inputs that require one
    const inputs = this.step.slots.flatMap((s, i) => (s.kind === 'input' && s.dtype === 'float32' ? [i] : []));
    const grads = differentiate(g, [...wrt, ...inputs.map((i) => values[i]!)], [[loss, dy]]);
    const sum = (before: GraphValue | null | undefined, grad: GraphValue) => (before ? g.node('Add', [before, grad]) : grad);
    grads.forEach((grad, i) => {
      if (grad === null) return;
      if (i < params.length) {
        const e = this.grads.get(params[i]) ?? { cleared: false, setToNone: true, added: null };
        this.grads.set(params[i], { ...e, added: sum(e.added, grad) });
      } else {
        const slot = inputs[i - params.length];
        this.inputGradients.set(slot, sum(this.inputGradients.get(slot), grad));
      }
    });
    return null;
  }

  /**
   * AdamW's update of each of the optimizer's parameters that has a gradient, as eager steps it: the gradient is what
   * backward added in the step, plus the one the parameter held before the run unless the step cleared it (fed then).
   */
  private optimizerStep(opt: GraphOptimizer): string | null {
    const { g } = this;
    const slotOf = new Map(this.step.slots.flatMap((s, i) => (s.kind === 'constant' && s.tensor ? [[s.tensor, i] as const] : [])));
    for (const p of opt.params) {
      const e = this.grads.get(p);
      if (e === undefined || e.added === null) {
        // eager skips a parameter whose .grad is null; one cleared to zeros would still decay and move with momentum
        if (e?.cleared && !e.setToNone) return 'an optimizer step after zeroGrad(false) with no backward between';
        if (e === undefined) {
          this.effects.guards.push(() => {
            if (p.grad !== null) {
              throw new TraceError('a compiled training step met a gradient it did not compute (a .grad left from before the step): call zeroGrad() first');
            }
          });
        }
        continue;
      }
      const state = opt.adamwGraph(p);
      const slot = slotOf.get(p);
      if (state === null || slot === undefined) return 'a parameter without a graph form of its update';
      const id = this.feeds.length;
      let grad = e.added;
      if (!e.cleared) {
        // what .grad held before the run (zeros where null) is part of the gradient eager steps with
        const before = g.know(new GraphValue(`grad0_${id}`, p.shape, 'float32'));
        const held = (): Float32Array => (p.grad?.data as Float32Array | undefined) ?? new Float32Array(p.size);
        this.feeds.push({ name: before.name, shape: p.shape, value: held });
        grad = g.node('Add', [before, grad]);
      }
      const scalars = g.know(new GraphValue(`adam_h${id}`, [8], 'float32'));
      this.feeds.push({ name: scalars.name, shape: [8], value: () => state.scalars() });
      let moments = this.moments.get(p);
      if (moments === undefined) {
        const [m, v] = (['m', 'v'] as const).map((k) => {
          const value = g.know(new GraphValue(`adam_${k}${id}`, p.shape, 'float32'));
          this.extraInputs.push({ value, source: state[k] });
          return value;
        });
        moments = { m, v };
      }
      const one = { shape: [1], type: 'float32' as const };
      const [decay, b1, c1, b2, c2, stepSize, bc2, eps] = g.multi('Split', [scalars], Array.from({ length: 8 }, () => one), { axis: 0 });
      const mul = (a: GraphValue, b: GraphValue) => g.node('Mul', [a, b], { shape: p.shape });
      const add = (a: GraphValue, b: GraphValue) => g.node('Add', [a, b], { shape: p.shape });
      const m2 = add(mul(moments.m, b1), mul(grad, c1));
      const v2 = add(mul(moments.v, b2), mul(mul(grad, grad), c2));
      const denom = add(g.node('Div', [g.node('Sqrt', [v2]), bc2], { shape: p.shape }), eps);
      const p2 = g.node('Sub', [mul(this.values[slot]!, decay), g.node('Div', [mul(m2, stepSize), denom], { shape: p.shape })], { shape: p.shape });
      // later ops of the step read the updated parameter and moments
      this.values[slot] = p2;
      this.moments.set(p, { m: m2, v: v2 });
      this.writes.set(p, { value: p2, kind: 'write', target: p });
      this.writes.set(state.m, { value: m2, kind: 'write', target: state.m });
      this.writes.set(state.v, { value: v2, kind: 'write', target: state.v });
    }
    return null;
  }
}

/**
 * Applies a training step's outputs on the host after a run (the ort backend; webgpu for host tensors): each gradient
 * added into (or put in place of) its parameter's or the run's input's `.grad`, each new value written over its
 * parameter or buffer; then the gradients the step left cleared.
 */
export function applyTrainingOutputs(
  outputs: readonly TrainingEntry[], values: readonly Float32Array[], inputs: readonly Tensor[], clears: HostEffects['clears'] = [],
): void {
  outputs.forEach((o, i) => {
    const value = values[i];
    if (o.kind === 'write') (o.target instanceof Float32Array ? o.target : (o.target.data as Float32Array)).set(value);
    else {
      const t = o.kind === 'inputGrad' ? inputs[o.target] : o.target;
      if (!(t instanceof Tensor) || (o.kind === 'inputGrad' && !t.requiresGrad)) return;
      if (t.grad === null || o.kind === 'setGrad') t.grad = new Tensor(value, [...o.shape]);
      else addInto(t.grad.data as Float32Array, value);
    }
  });
  clearGradients(clears);
}

/** The gradients a step left cleared, as zeroGrad leaves them (null, or zeros in place). */
export function clearGradients(clears: HostEffects['clears']): void {
  for (const { target, setToNone } of clears) {
    if (setToNone || target.grad === null) target.grad = null;
    else if (target.grad.deviceStorage === null) (target.grad.data as Float32Array).fill(0);
    else target.grad = null;
  }
}
