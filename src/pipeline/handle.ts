import type { Tensor } from '../tensor/index.ts';
import type { ReduceGroup } from './exchange.ts';

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
  forward(micro: number, input: Tensor): Promise<Tensor>;
  /** The gradient of the input (null when the input is token ids). */
  backward(micro: number, grad: Tensor): Promise<Tensor | null>;
  /** ‖g‖² of each named parameter. */
  gradSquares(names: readonly string[]): Promise<number[]>;
  reduce(group: ReduceGroup): Promise<void>;
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
