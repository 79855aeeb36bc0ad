/** What the planner weighs: a model's layers and the devices that may host them. */

/** One cuttable layer (from a model's layer profiles). */
export interface LayerCost {
  name: string;
  params: number;
  /** Bytes its parameters take on a device. */
  bytes: number;
  /** Forward FLOPs per token. */
  flopsPerToken: number;
  /** Bytes of its output per token: what crosses to the next stage when a cut follows it. */
  activationBytesPerToken: number;
}

export interface Device {
  id: string;
  memoryBytes: number;
  /** Measured engine speed. */
  gflops: number;
}

/** Network between devices: bandwidth (bytes/s) and one-way latency (s); missing pairs use the defaults (see `measuredLinks`). */
export interface Links {
  bandwidth?: (from: string, to: string) => number | undefined;
  latency?: (from: string, to: string) => number | undefined;
  defaultBandwidth?: number;
  defaultLatency?: number;
}

/**
 * How activations travel in one step, which decides the hops a stage pays (see `Hop` in cost.ts):
 * - 'chain': hidden states go worker to worker, the user sends the first its input and takes the last's output;
 * - 'relay': the user passes every stage its input and takes its output;
 * - 'train': worker to worker as in a chain, forward and backward (gradients of the activations come back the same
 *   size), with a request from the user and an answer for every forward and backward.
 */
export type Traffic = 'chain' | 'relay' | 'train';

/** What a plan is made for: the step it times, the links it crosses, and who the user is. */
export interface PlanOptions {
  /** Tokens per step (default 1: a decoding step); in training, every micro-batch's tokens together. */
  tokens?: number;
  links?: Links;
  /**
   * The user's device id. Given, the user's links are charged to the stages that use them (in a
   * chain the first stage's input and the last stage's output), so a plan can avoid a slow one.
   * Absent, a chain's ends are free (the plan covers the workers only); relay and train still
   * charge the user's hops, at the links' defaults.
   */
  user?: string;
  /** Bytes per token the user sends the first stage (default: the first layer's activation bytes, the residual stream's width). */
  inputBytesPerToken?: number;
  /** How activations travel (default 'chain'). */
  traffic?: Traffic;
  /** Micro-batches per training step (default 1): each pays the latencies of its messages. */
  microBatches?: number;
}

export interface Stage {
  device: string;
  /** Layers [start, end) of the model. */
  start: number;
  end: number;
  params: number;
  bytes: number;
  /** Predicted seconds per step: compute plus the hops charged to it (sending its output on; see `Hop`). */
  seconds: number;
}

export interface Plan {
  strategy: 'parameter-balanced' | 'ring-memory-weighted' | 'layer-aware';
  stages: Stage[];
  /** The slowest stage's predicted seconds: the pipeline's step time when steps overlap (see `stepSeconds` for one step alone). */
  bottleneckSeconds: number;
}

export type StrategyName = Plan['strategy'];
