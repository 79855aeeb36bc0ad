import { InvalidMessageError } from '../errors.ts';
import type { Frame } from '../p2p/frames.ts';
import { REDUCE_TIMEOUT_MS, type ReduceGroup, type StageHandle } from '../pipeline/index.ts';
import type { Tensor } from '../tensor/index.ts';
import type { RemoteStage } from './remote-stage.ts';
import { fromWire } from './wire-tensor.ts';

/** How long one training request may take on a worker (a forward or backward of a big section). */
export const TRAIN_REQUEST_TIMEOUT_MS = 300_000;

function tensorOf(frame: Frame, what: string): Tensor {
  if (frame.kind !== 'tensor') throw new InvalidMessageError(`${what}: expected a tensor`);
  return fromWire(frame.tensor);
}

function controlOf(frame: Frame, what: string): Record<string, unknown> {
  if (frame.kind !== 'control' || typeof frame.message !== 'object' || frame.message === null) throw new InvalidMessageError(`${what}: expected a control answer`);
  return frame.message as Record<string, unknown>;
}

/** A section being trained on a worker, driven over the job's stage stream (the libp2p side of `StageHandle`). */
export class RemoteTrainStage implements StageHandle {
  names: readonly string[] = [];

  constructor(
    readonly stage: RemoteStage,
    /** The worker's address with its peer id: where its replicas send gradients. */
    readonly address: string,
    readonly peerId: string,
    readonly label: string,
  ) {}

  private call(header: Record<string, unknown>, tensors: Tensor[] = [], timeoutMs = TRAIN_REQUEST_TIMEOUT_MS): Promise<Frame> {
    return this.stage.call({ ...header, tensors: tensors.length }, tensors, timeoutMs);
  }

  /** Creates the worker's optimizer for its section; `peers` may send it gradients (replicas, a tied head). */
  async setup(options: { lr: number; weightDecay?: number; recompute?: boolean; peers: string[] }): Promise<void> {
    const answer = controlOf(await this.call({ type: 'train-setup', ...options }), 'train-setup');
    const names = answer.names;
    if (!Array.isArray(names) || !names.every((n) => typeof n === 'string')) throw new InvalidMessageError('train-setup: expected the names of the parameters');
    this.names = names as string[];
  }

  async forward(micro: number, input: Tensor): Promise<Tensor> {
    return tensorOf(await this.call({ type: 'train-forward', micro }, [input]), 'train-forward');
  }

  async backward(micro: number, grad: Tensor): Promise<Tensor | null> {
    const answer = await this.call({ type: 'train-backward', micro }, [grad]);
    return answer.kind === 'tensor' ? fromWire(answer.tensor) : null;
  }

  async gradSquares(names: readonly string[]): Promise<number[]> {
    const values = controlOf(await this.call({ type: 'grad-squares', names }), 'grad-squares').values;
    if (!Array.isArray(values) || values.length !== names.length || !values.every((v) => typeof v === 'number')) {
      throw new InvalidMessageError('grad-squares: expected one number per name');
    }
    return values as number[];
  }

  async reduce(group: ReduceGroup): Promise<void> {
    await this.call({ type: 'reduce', ...group }, [], REDUCE_TIMEOUT_MS + 10_000);
  }

  async step(scale: number, lr: number): Promise<void> {
    await this.call({ type: 'step', scale, lr });
  }

  async weights(): Promise<Map<string, Tensor>> {
    const out = new Map<string, Tensor>();
    for (const name of this.names) out.set(name, tensorOf(await this.call({ type: 'weight', name }), 'weight'));
    return out;
  }

  async optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>> {
    const out = new Map<string, { moments: Tensor; step: number }>();
    const steps = controlOf(await this.call({ type: 'moment-steps', names: this.names }), 'moment-steps').steps;
    if (!Array.isArray(steps) || steps.length !== this.names.length) throw new InvalidMessageError('moment-steps: expected one entry per name');
    for (const [i, name] of this.names.entries()) {
      const step = steps[i];
      if (typeof step !== 'number') continue; // no step taken yet
      out.set(name, { moments: tensorOf(await this.call({ type: 'moments', name }), 'moments'), step });
    }
    return out;
  }

  async setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void> {
    for (const name of this.names) {
      const s = state.get(name);
      if (s) await this.call({ type: 'set-moments', name, step: s.step }, [s.moments]);
    }
  }

  async reset(): Promise<void> {
    await this.call({ type: 'train-reset' }, [], 10_000);
  }
}
