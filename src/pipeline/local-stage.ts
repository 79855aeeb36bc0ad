import { InvalidArgumentError } from '../errors.ts';
import { type Tensor, tensor } from '../tensor/index.ts';
import type { StageExecutor } from './executor.ts';
import { type GradientCodec, GradientExchange, type GradientPayload, type ReduceGroup } from './exchange.ts';
import { type Activation, isPassed, type StageHandle } from './handle.ts';

const stages = new Map<string, LocalStage>();
let counter = 0;

/** A copy, as a message would carry it: the receiver never shares a buffer with the sender. */
function copy(t: Tensor): Tensor {
  return tensor(t.data.slice(), t.shape, t.dtype);
}

/** A tensor this process holds: a stage here is never sent tensors worker to worker. */
function held(x: Activation): Tensor {
  if (isPassed(x)) throw new InvalidArgumentError(`a stage in this process cannot take a tensor passed between workers (${x.key})`);
  return x;
}

/**
 * A stage in this process: the user's own ends, and the in-memory transport tests use to
 * run a whole pipeline in one process. Tensors are copied across, as over a wire.
 */
export class LocalStage implements StageHandle {
  readonly address = `memory:${++counter}`;
  readonly names: readonly string[];
  private readonly exchange: GradientExchange;

  constructor(
    readonly executor: StageExecutor,
    readonly label = 'this machine',
    /** How its gradients travel to the other holders of its parameters (null: dense float32). */
    codec: GradientCodec | null = null,
    /** It takes local steps among replicas (`sync`): it keeps the weights they start from. */
    localSteps = false,
  ) {
    this.exchange = new GradientExchange(codec);
    if (localSteps) this.exchange.anchor(executor);
    this.names = [...executor.named.keys()];
    stages.set(this.address, this);
  }

  async forward(micro: number, input: Activation): Promise<Tensor> {
    return copy(this.executor.forward(micro, held(input)));
  }

  async backward(micro: number, grad: Activation): Promise<Tensor | null> {
    const g = this.executor.backward(micro, held(grad));
    return g && copy(g);
  }

  async gradSquares(names: readonly string[]): Promise<number[]> {
    return this.executor.gradSquares(names);
  }

  /** Sends gradients (or weights' changes) of `group` to another stage of this process, copied as a message would be. */
  private deliverTo(group: ReduceGroup) {
    return async (peer: string, grads: GradientPayload) => {
      const other = stages.get(peer);
      if (!other) throw new InvalidArgumentError(`no stage at ${peer} in this process`);
      const copied = grads.map((g: Tensor | Uint8Array) => (g instanceof Uint8Array ? g.slice() : copy(g)));
      other.exchange.deliver(group.key, group.index, copied as GradientPayload);
    };
  }

  async reduce(group: ReduceGroup): Promise<void> {
    await this.exchange.reduce(this.executor, group, this.deliverTo(group));
  }

  async sync(group: ReduceGroup): Promise<null> {
    await this.exchange.average(this.executor, group, this.deliverTo(group));
    return null;
  }

  async step(scale: number, lr: number): Promise<void> {
    this.executor.step(scale, lr);
    this.exchange.commit();
  }

  async weights(): Promise<Map<string, Tensor>> {
    return new Map([...this.executor.named].map(([n, p]) => [n, copy(p)]));
  }

  async optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>> {
    const out = new Map<string, { moments: Tensor; step: number }>();
    for (const name of this.names) {
      const m = this.executor.moments(name);
      if (m) out.set(name, m);
    }
    return out;
  }

  async setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void> {
    for (const name of this.names) {
      const s = state.get(name);
      if (s) this.executor.setMoments(name, copy(s.moments), s.step);
    }
  }

  async reset(): Promise<void> {
    this.executor.reset();
    this.exchange.clear();
  }

  /** Unregisters it (no more reductions reach it). */
  close(): void {
    stages.delete(this.address);
  }
}
