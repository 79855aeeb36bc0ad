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

/** Network between devices: bandwidth (bytes/s) and latency (s); missing pairs use the defaults. */
export interface Links {
  bandwidth?: (from: string, to: string) => number | undefined;
  latency?: (from: string, to: string) => number | undefined;
  defaultBandwidth?: number;
  defaultLatency?: number;
}

export interface Stage {
  device: string;
  /** Layers [start, end) of the model. */
  start: number;
  end: number;
  params: number;
  bytes: number;
  /** Predicted seconds per step: compute plus sending its output to the next stage. */
  seconds: number;
}

export interface Plan {
  strategy: 'parameter-balanced' | 'ring-memory-weighted' | 'layer-aware';
  stages: Stage[];
  /** The slowest stage's predicted seconds: the pipeline's step time. */
  bottleneckSeconds: number;
}

export type StrategyName = Plan['strategy'];
