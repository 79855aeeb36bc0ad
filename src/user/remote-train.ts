import {
  type Frame, parseGradSquares, parseMomentSteps, parseTrainReady, type PeerTarget, TRAIN_REQUEST_TIMEOUT_MS,
} from '../p2p/index.ts';
import { REDUCE_TIMEOUT_MS, type ReduceGroup, type StageHandle } from '../pipeline/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { controlAnswer, type RemoteStage, tensorAnswer } from './remote-stage.ts';

/** A section being trained on a worker, driven over the job's stage stream (the libp2p side of `StageHandle`). */
export class RemoteTrainStage implements StageHandle {
  names: readonly string[] = [];
  /** Other holders of its parameters name it by peer id; the worker finds the addresses in the job's assignment. */
  readonly address: string;
  readonly peerId: string;

  constructor(
    readonly stage: RemoteStage,
    readonly worker: PeerTarget,
    readonly label: string,
  ) {
    this.peerId = worker.peerId;
    this.address = worker.peerId;
  }

  private call(header: Record<string, unknown>, tensors: Tensor[] = [], timeoutMs = TRAIN_REQUEST_TIMEOUT_MS): Promise<Frame> {
    return this.stage.call(header, tensors, timeoutMs);
  }

  /** Creates the worker's optimizer for its section; `peers` (peer ids) may send it gradients (replicas, a tied head). */
  async setup(options: { lr: number; weightDecay?: number; recompute?: boolean; peers: string[] }): Promise<void> {
    this.names = parseTrainReady(controlAnswer(await this.call({ type: 'train-setup', ...options }), 'train-setup'));
  }

  async forward(micro: number, input: Tensor): Promise<Tensor> {
    return tensorAnswer(await this.call({ type: 'train-forward', micro }, [input]), 'train-forward');
  }

  async backward(micro: number, grad: Tensor): Promise<Tensor | null> {
    const answer = await this.call({ type: 'train-backward', micro }, [grad]);
    return answer.kind === 'tensor' ? tensorAnswer(answer, 'train-backward') : null;
  }

  async gradSquares(names: readonly string[]): Promise<number[]> {
    return parseGradSquares(controlAnswer(await this.call({ type: 'grad-squares', names }), 'grad-squares'), names.length);
  }

  async reduce(group: ReduceGroup): Promise<void> {
    await this.call({ type: 'reduce', ...group }, [], REDUCE_TIMEOUT_MS + 10_000);
  }

  async step(scale: number, lr: number): Promise<void> {
    await this.call({ type: 'step', scale, lr });
  }

  async weights(): Promise<Map<string, Tensor>> {
    const out = new Map<string, Tensor>();
    for (const name of this.names) out.set(name, await this.stage.weight(name));
    return out;
  }

  /** The parameters that have taken a step, with their step counts. */
  async momentSteps(): Promise<{ name: string; step: number }[]> {
    const steps = parseMomentSteps(controlAnswer(await this.call({ type: 'moment-steps', names: this.names }), 'moment-steps'), this.names.length);
    return this.names.flatMap((name, i) => (steps[i] === null ? [] : [{ name, step: steps[i] }]));
  }

  /** AdamW's moments of one parameter, [2, ...shape]. */
  async moments(name: string): Promise<Tensor> {
    return tensorAnswer(await this.call({ type: 'moments', name }), 'moments');
  }

  async optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>> {
    const out = new Map<string, { moments: Tensor; step: number }>();
    for (const { name, step } of await this.momentSteps()) out.set(name, { moments: await this.moments(name), step });
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
