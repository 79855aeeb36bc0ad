import { InvalidArgumentError } from '../../errors.ts';
import { compositeOp, releaseFloat32, type Tensor } from '../../tensor/index.ts';

/** A set of parameters sharing hyper-parameters (PyTorch's param groups). */
export interface ParamGroup<H> {
  params: Tensor[];
  options?: Partial<H>;
}

export interface ResolvedGroup<H> {
  params: Tensor[];
  options: H;
}

/**
 * The base of every optimizer: parameter groups, `lr` (settable, applies to all
 * groups, as a scheduler does), per-parameter state and zeroGrad. Steps run outside
 * autograd and update parameter buffers in place. `step`, `zeroGrad` and `releaseGrads` are
 * ops of a traced step (compositeOp): a replay of a traced training step updates again.
 */
export abstract class Optimizer<H extends { lr: number }> {
  readonly groups: ResolvedGroup<H>[];
  protected readonly state = new Map<Tensor, Record<string, Float32Array | number>>();

  constructor(params: Tensor[] | ParamGroup<H>[], defaults: H) {
    if (defaults.lr < 0) throw new InvalidArgumentError(`learning rate must be ≥ 0, got ${defaults.lr}`);
    const list = params as (Tensor | ParamGroup<H>)[];
    const groups: ParamGroup<H>[]
      = list.length > 0 && 'params' in (list[0] as object)
        ? (list as ParamGroup<H>[])
        : [{ params: list as Tensor[] }];
    this.groups = groups.map((g) => ({ params: g.params, options: { ...defaults, ...g.options } }));
  }

  get lr(): number {
    return this.groups[0]?.options.lr ?? 0;
  }

  set lr(value: number) {
    for (const g of this.groups) g.options.lr = value;
  }

  /** All parameters across groups. */
  get params(): Tensor[] {
    return this.groups.flatMap((g) => g.params);
  }

  /**
   * Clears every gradient: to null (PyTorch's default `set_to_none`), or with
   * `setToNone: false` to zeros in place, which keeps the buffers (no fresh memory next step).
   */
  zeroGrad(setToNone = true): void {
    zeroGradOp(this, setToNone);
  }

  /** @internal zeroGrad's work. */
  clearGrads(setToNone: boolean): void {
    for (const p of this.params) {
      if (setToNone || p.grad === null) p.grad = null;
      else p.grad.data.fill(0);
    }
  }

  /**
   * Sets every gradient to null and hands their buffers back to the allocator, for a
   * training loop that keeps no reference to old gradients (the next backward reuses the
   * memory instead of touching fresh pages).
   */
  releaseGrads(): void {
    releaseGradsOp(this);
  }

  /** @internal releaseGrads' work. */
  releaseGradsNow(): void {
    for (const p of this.params) {
      if (p.grad?.data instanceof Float32Array) releaseFloat32(p.grad.data);
      p.grad = null;
    }
  }

  /** Applies one update to every parameter that has a gradient. */
  step(): void {
    stepOp(this);
  }

  /** @internal step's work. */
  stepNow(): void {
    for (const group of this.groups) {
      for (const p of group.params) {
        if (p.grad === null) continue;
        let s = this.state.get(p);
        if (s === undefined) {
          s = {};
          this.state.set(p, s);
        }
        this.update(p, p.grad, s, group.options);
      }
    }
  }

  protected abstract update(
    p: Tensor,
    grad: Tensor,
    state: Record<string, Float32Array | number>,
    h: H,
  ): void;

  /** The state of one parameter (moments, step), or undefined before its first step. */
  getState(p: Tensor): Record<string, Float32Array | number> | undefined {
    return this.state.get(p);
  }

  /** Restores the state of one parameter (from a checkpoint). */
  setState(p: Tensor, state: Record<string, Float32Array | number>): void {
    for (const v of Object.values(state)) {
      if (v instanceof Float32Array && v.length !== p.size) {
        throw new InvalidArgumentError(`optimizer state of ${v.length} values does not fit a parameter of ${p.size}`);
      }
    }
    this.state.set(p, { ...state });
  }

  /** Optimizer state per parameter index, for checkpoints. */
  stateDict(): { state: Record<string, Float32Array | number>[]; lr: number } {
    return { state: this.params.map((p) => ({ ...(this.state.get(p) ?? {}) })), lr: this.lr };
  }

  loadStateDict(saved: { state: Record<string, Float32Array | number>[]; lr: number }): void {
    const params = this.params;
    if (saved.state.length !== params.length) {
      throw new InvalidArgumentError(
        `optimizer state has ${saved.state.length} entries, expected ${params.length}`,
      );
    }
    params.forEach((p, i) => {
      const entry = saved.state[i];
      if (Object.keys(entry).length > 0) this.state.set(p, { ...entry });
    });
    this.lr = saved.lr;
  }
}

type AnyOptimizer = Optimizer<{ lr: number }>;
// an optimizer's state changes as ops of a traced step (tensor/'s compositeOp; one boolean read outside a trace)
const stepOp = compositeOp('optimizerStep', (opt: AnyOptimizer): void => opt.stepNow());
const zeroGradOp = compositeOp('zeroGrad', (opt: AnyOptimizer, setToNone: boolean): void => opt.clearGrads(setToNone));
const releaseGradsOp = compositeOp('releaseGrads', (opt: AnyOptimizer): void => opt.releaseGradsNow());

export function stateBuffer(
  state: Record<string, Float32Array | number>,
  key: string,
  size: number,
): Float32Array {
  let buf = state[key];
  if (!(buf instanceof Float32Array)) {
    buf = new Float32Array(size);
    state[key] = buf;
  }
  return buf;
}
