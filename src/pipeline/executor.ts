import { InvalidArgumentError } from '../errors.ts';
import { type AdamW, gradNormSquared, scaleGrads } from '../nn/index.ts';
import { layerParameters, type ModelLayer, runLayers, trainingOptimizer } from '../models/index.ts';
import { addInto, type Backend, noGrad, type Tensor, tensor, zeros } from '../tensor/index.ts';
import { DeviceSection } from './device-stage.ts';

export interface ExecutorOptions {
  lr: number;
  weightDecay?: number;
  /**
   * Activation checkpointing: keep only each micro-batch's input after the forward and run
   * the forward again in the backward (less memory, one more forward per micro-batch).
   */
  recompute?: boolean;
  /**
   * Parameters this executor shares with another in this process that owns and steps them
   * (a head tied to the user's embedding): this one is the `user` side of the tie.
   */
  tied?: { ties: TiedParameters; role: 'owner' | 'user' };
  /**
   * Each backward's contribution to the parameters' gradients is computed apart and then
   * added to them (bit for bit what accumulating in the backward gives), and handed to this
   * first: a worker hashes it into the backward's record (and fault injection may alter it).
   */
  onContribution?: (micro: number, contribution: Map<string, Tensor>) => void;
  /**
   * Keep each micro-batch's contribution to the gradients until the step (a copy: the trained size per micro-batch),
   * for an ordered reduction among replicas (ReduceGroup.micros) that adds them in the batch's order.
   */
  keepMicros?: boolean;
  /**
   * A device backend (webgpu) to run the forwards and backwards on, each micro-batch shape's as one graph there
   * (device-stage.ts); the optimizer steps on the host. Not with `tied`.
   */
  device?: Backend;
}

/**
 * A tensor two executors of one process share (a tied head is its token embedding). One
 * process sums a micro-batch's two contributions first and then adds the sum to the
 * gradient; so here the user side's contribution is held back, and the owner adds it to its
 * own before accumulating: training stays bit for bit the same as in one process.
 */
export class TiedParameters {
  private readonly pending = new Map<number, Map<Tensor, Tensor>>();

  constructor(readonly params: ReadonlySet<Tensor>) {}

  /** Runs `backward` with the tied gradients set aside; returns what it contributed to them. */
  private isolated(backward: () => void): Map<Tensor, Tensor> {
    const before = new Map([...this.params].map((p) => [p, p.grad]));
    for (const p of this.params) p.grad = null;
    backward();
    const contributed = new Map<Tensor, Tensor>();
    for (const p of this.params) {
      if (p.grad) contributed.set(p, p.grad);
      p.grad = before.get(p) ?? null;
    }
    return contributed;
  }

  /** The user side's backward of `micro`: its contribution waits for the owner's. */
  holdBack(micro: number, backward: () => void): void {
    this.pending.set(micro, this.isolated(backward));
  }

  /** The owner's backward of `micro`: both contributions are summed, then accumulated. */
  combine(micro: number, backward: () => void): void {
    const own = this.isolated(backward);
    const held = this.pending.get(micro) ?? new Map<Tensor, Tensor>();
    this.pending.delete(micro);
    for (const p of this.params) {
      let sum: Float32Array | null = null;
      for (const g of [own.get(p), held.get(p)]) {
        if (!g) continue;
        if (!sum) sum = g.data as Float32Array;
        else addInto(sum, g.data);
      }
      if (!sum) continue;
      if (!p.grad) p.grad = tensor(sum, p.shape);
      else {
        addInto(p.grad.data as Float32Array, sum);
      }
    }
  }

  clear(): void {
    this.pending.clear();
  }
}

interface Saved {
  input: Tensor;
  output: Tensor | null;
}

/**
 * Runs one section of a model for training: forwards per micro-batch (keeping what the
 * backward needs), backwards given the gradient of the output (returning the gradient of
 * the input), gradients accumulated over the micro-batches of a step, and its own AdamW.
 * The same class runs on a worker and on the user's machine (its ends).
 */
export class StageExecutor {
  readonly optimizer: AdamW;
  /**
   * The parameters it trains, under their checkpoint names; a tensor shared by two layers (a tied head) once. A frozen
   * base (an adapter's, or a compact section) is not among them: its gradients, moments and copies are never made.
   */
  readonly named: Map<string, Tensor>;
  /** The parameters it holds frozen (those that do not require grad: a base under an adapter), by checkpoint name. */
  readonly frozen: Map<string, Tensor>;
  private readonly saved = new Map<number, Saved>();
  /** Each micro-batch's contribution to the gradients this step (keepMicros). */
  private readonly micros = new Map<number, Map<string, Tensor>>();
  /** Where the forwards and backwards run on a device (options.device), null on the CPU (or once the device refused). */
  private device: DeviceSection | null;

  constructor(
    readonly layers: readonly ModelLayer[],
    private readonly maxPositions: number,
    private readonly options: ExecutorOptions,
  ) {
    if (layers.length === 0) throw new InvalidArgumentError('a stage needs at least one layer');
    const all = layerParameters(layers, options.tied?.role === 'user' ? options.tied.ties.params : undefined);
    this.named = new Map([...all].filter(([, p]) => p.requiresGrad));
    this.frozen = new Map([...all].filter(([, p]) => !p.requiresGrad));
    this.optimizer = trainingOptimizer([...this.named.values()], options);
    if (options.device && options.tied) throw new InvalidArgumentError('a section with tied parameters trains on the CPU');
    this.device = options.device ? new DeviceSection(layers, maxPositions, options.device, [...this.named.values()]) : null;
  }

  /** The device backend's name where forwards and backwards run there, null on the CPU. */
  get deviceName(): string | null {
    return this.device === null ? null : (this.options.device?.name ?? null);
  }

  /** Micro-batches whose forward ran and whose backward has not. */
  get held(): number {
    return this.saved.size;
  }

  private run(input: Tensor): Tensor {
    return runLayers(this.layers, input, {}, this.maxPositions);
  }

  /** The forward of micro-batch `micro`: ids [b, T] or hidden states [b, T, H] in, the section's output out (detached). */
  forward(micro: number, input: Tensor): Tensor {
    const leaf = input.dtype === 'int32' ? input : input.detach();
    if (leaf.dtype !== 'int32') leaf.requiresGrad = true;
    if (this.device) {
      // the backward's graph runs the forward again: nothing is held between the two but the input
      const output = this.device.forward(leaf);
      if (output !== null) {
        this.saved.set(micro, { input: leaf, output: null });
        return output;
      }
      // the device refused this section's steps: it trains on the CPU from here on (its records say so)
      this.device = null;
    }
    if (this.options.recompute) {
      this.saved.set(micro, { input: leaf, output: null });
      return noGrad(() => this.run(leaf));
    }
    const output = this.run(leaf);
    this.saved.set(micro, { input: leaf, output });
    return output.detach();
  }

  /** The backward of micro-batch `micro` given the gradient of its output; the gradient of its input (null for token ids). */
  backward(micro: number, grad: Tensor): Tensor | null {
    const s = this.saved.get(micro);
    if (!s) throw new InvalidArgumentError(`backward of micro-batch ${micro} before its forward`);
    this.saved.delete(micro);
    let onDevice: Tensor | null = null;
    let run: () => void;
    if (this.device) {
      const device = this.device;
      run = () => void (onDevice = device.backward(s.input, grad));
    } else {
      const output = s.output ?? this.run(s.input);
      if (grad.shape.length !== output.shape.length || grad.shape.some((d, i) => d !== output.shape[i])) {
        throw new InvalidArgumentError(`the gradient [${grad.shape}] does not match the output [${output.shape}] of micro-batch ${micro}`);
      }
      // a frozen section under nothing that trains (the user's embedding in an adapter job) recorded no graph: nothing flows back
      run = () => {
        if (output.requiresGrad) output.backward(grad, { releaseActivations: true });
      };
    }
    const tied = this.options.tied;
    if (this.options.onContribution || (this.options.keepMicros && !tied)) this.contribute(micro, run);
    else if (tied?.role === 'user') tied.ties.holdBack(micro, run);
    else if (tied) tied.ties.combine(micro, run);
    else run();
    if (s.input.dtype === 'int32') return null;
    return onDevice ?? s.input.grad ?? zeros(s.input.shape);
  }

  /** Runs a backward with the gradients set aside, hands its contribution on, then adds it to them. */
  private contribute(micro: number, backward: () => void): void {
    const before = new Map([...this.named].map(([n, p]) => [n, p.grad]));
    for (const p of this.named.values()) p.grad = null;
    backward();
    const contribution = new Map<string, Tensor>();
    for (const [n, p] of this.named) if (p.grad) contribution.set(n, p.grad);
    this.options.onContribution?.(micro, contribution);
    // a copy: the first contribution becomes the gradient, which the next ones are added into
    if (this.options.keepMicros) this.micros.set(micro, new Map([...contribution].map(([n, t]) => [n, t.clone()])));
    for (const [n, p] of this.named) {
      const c = contribution.get(n);
      const acc = before.get(n) ?? null;
      // a parameter the micro-batch did not reach keeps what it had (null stays null: AdamW skips it)
      if (!c) {
        p.grad = acc;
        continue;
      }
      if (!acc) p.grad = c;
      else {
        addInto(acc.data as Float32Array, c.data);
        p.grad = acc;
      }
    }
  }

  /** Micro-batch `micro`'s contribution to parameter `name`'s gradient this step (keepMicros); undefined if none reached it. */
  contributionOf(micro: number, name: string): Tensor | undefined {
    return this.micros.get(micro)?.get(name);
  }

  /** ‖g‖² of each named parameter (the user adds them, in the model's order, into the global norm). */
  gradSquares(names: readonly string[]): number[] {
    return names.map((n) => gradNormSquared([this.param(n)]));
  }

  private param(name: string): Tensor {
    const p = this.named.get(name);
    if (!p) throw new InvalidArgumentError(`'${name}' is not a parameter of this stage`);
    return p;
  }

  /** The gradients of the named parameters (zeros where none accumulated). */
  grads(names: readonly string[]): Tensor[] {
    return names.map((n) => {
      const p = this.param(n);
      return p.grad ?? zeros(p.shape);
    });
  }

  /** Replaces the named parameters' gradients (after replicas reduced them). */
  setGrads(names: readonly string[], grads: Tensor[]): void {
    names.forEach((n, i) => {
      const p = this.param(n);
      const g = grads[i];
      if (g.size !== p.size) throw new InvalidArgumentError(`the gradient of '${n}' has ${g.size} values, the parameter ${p.size}`);
      p.grad = g;
    });
  }

  /** Scales the gradients by `scale` (global clipping) and takes one AdamW step at `lr`; frees the gradients. */
  step(scale: number, lr: number): void {
    if (this.saved.size > 0) throw new InvalidArgumentError(`${this.saved.size} micro-batches have not run their backward`);
    const params = [...this.named.values()];
    if (scale < 1) scaleGrads(params, scale);
    this.optimizer.lr = lr;
    this.optimizer.step();
    this.optimizer.releaseGrads();
    this.micros.clear();
    this.weightsChanged();
  }

  /** The weights changed on the host (a step, an average of local steps): a device reads them again. */
  weightsChanged(): void {
    this.device?.refresh();
  }

  /** How many AdamW steps a parameter has taken (null before the first). */
  stepsOf(name: string): number | null {
    return (this.optimizer.getState(this.param(name))?.step as number | undefined) ?? null;
  }

  /** AdamW's moments of a parameter as one [2, ...shape] tensor (exp_avg, exp_avg_sq), and its step count; null before any step. */
  moments(name: string): { moments: Tensor; step: number } | null {
    return this.optimizer.moments(this.param(name));
  }

  /** AdamW's moments of a parameter as held (not copied: read them at once), and its step count; null before any step. */
  momentParts(name: string): { parts: readonly [Float32Array, Float32Array]; step: number } | null {
    return this.optimizer.momentParts(this.param(name));
  }

  /** Restores what `moments` gave (resuming a job from a checkpoint). */
  setMoments(name: string, moments: Tensor, step: number): void {
    this.optimizer.setMoments(this.param(name), moments, step);
  }

  /** Drops what a failed step left behind (saved activations, gradients). */
  reset(): void {
    this.saved.clear();
    this.micros.clear();
    this.options.tied?.ties.clear();
    for (const p of this.named.values()) p.grad = null;
  }
}
