import type { Tensor } from '../tensor/index.ts';
import type { ReduceGroup } from './exchange.ts';

/**
 * A stage's output (or input gradient) that went straight to the worker of the next stage
 * (or the previous one) instead of back to the user: only its hash and shape come back, and
 * the key under which the receiving worker holds it. The receiver is told the key.
 */
export interface Passed {
  passed: true;
  /** The worker that passed it on (only its pass under `key` is taken). */
  sender: string;
  key: string;
  /** The hash of the tensor as the receiver gets it (its record must name this as its input). */
  hash: string;
  shape: number[];
}

/** What travels between stages: a tensor, or a tensor already passed on between workers. */
export type Activation = Tensor | Passed;

export function isPassed(x: Activation | null): x is Passed {
  return x !== null && (x as Passed).passed === true;
}

/**
 * The pipeline's view of one stage (the `Transport` of ARCHITECTURE.md): the same trainer
 * drives stages in this process (`LocalStage`) and on workers over libp2p (`RemoteTrainStage`).
 */
export interface StageHandle {
  /** Who runs it, for messages: "worker 12D3Koo…" or "this machine". */
  readonly label: string;
  /** How the other holders of its parameters name it in reductions: a worker's peer id, or `memory:N` in this process. */
  readonly address: string;
  /** Its parameters under their checkpoint names. */
  readonly names: readonly string[];
  /**
   * Where other stages may pass tensors to it directly (a worker's peer id); absent for a
   * stage that only takes tensors from the user (this process, a redundant stage).
   */
  readonly direct?: string;
  /** Its output; with `to` (the next stage's `direct`) the output goes there and a `Passed` comes back. */
  forward(micro: number, input: Activation, to?: string): Promise<Activation>;
  /** The gradient of the input (null when the input is token ids); with `to`, passed to the previous stage. */
  backward(micro: number, grad: Activation, to?: string): Promise<Activation | null>;
  /** ‖g‖² of each named parameter. */
  gradSquares(names: readonly string[]): Promise<number[]>;
  reduce(group: ReduceGroup): Promise<void>;
  /**
   * Local steps (`syncEvery` > 1): averages its weights' changes since the last average with
   * the other replicas of its stage. Returns the hash of its weights afterwards (a worker), or
   * null (in this process); every holder of a group must end with the same.
   */
  sync?(group: ReduceGroup): Promise<string | null>;
  step(scale: number, lr: number): Promise<void>;
  /** Its current weights (after training: what the user saves). */
  weights(): Promise<Map<string, Tensor>>;
  /** AdamW's moments of each parameter that has taken a step ([2, ...shape]: exp_avg, exp_avg_sq) and the step count. */
  optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>>;
  /** Restores optimizer state (resuming); names this stage does not hold are ignored. */
  setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void>;
  /** Drops the activations and gradients a failed step left behind. */
  reset(): Promise<void>;
}
