import { lowerStep, type Tensor, tensor, type TracedStep, zeros } from '../../tensor/index.ts';
import { loadOrtRuntime, type Feed, type OrtSession } from '../../tensor/backends/ort/runtime.ts';
import type { CausalLM } from '../model.ts';
import { traceCachedStep } from './device-step.ts';

/**
 * Greedy-style decoding of one sequence on the CPU with the whole step as ONE onnxruntime graph: the model's
 * one-token step on a bounded KV cache of `capacity` slots (forward.ts, LayerCache.slot) is traced once on the host
 * (js), lowered to one ONNX graph (graph/step-graph.ts: int8/int4 weights as MatMulNBits initializers) and opened
 * as one session; each token is then one native call. A prompt goes through the same graph a token at a time, so a
 * model holds ONE session and ONE prepacked copy of its weights (DeviceRunner would open one per prompt shape and
 * per cache size).
 *
 * The cache lives in two sets of host buffers that the graph reads and writes in place (the ffi runtime): a step
 * reads one set and writes the grown cache into the other, then they swap, so a step allocates nothing.
 */
export interface GraphDecoderOptions {
  /** Cache slots: prompt and decoded tokens together (default: the model's maxPositions). */
  capacity?: number;
  /** onnxruntime's intra-op threads (default 1). */
  threads?: number;
  /** Whether onnxruntime's idle pool threads spin (default false). */
  spinning?: boolean;
}

/** Times spent in a decoder's steps, in milliseconds: inside onnxruntime's run, and the js around it. */
export interface GraphDecodeProfile {
  steps: number;
  runMs: number;
  glueMs: number;
  /** Tracing, lowering and opening the session. */
  compileMs: number;
}

export class GraphDecoder {
  readonly capacity: number;
  private readonly session: OrtSession;
  /** Feeds that never change (weights, the step's constants), by reference. */
  private readonly fixed: Feed[] = [];
  /** Where each step input's feed sits among the feeds, by input slot (−1: the graph does not read it). */
  private readonly inputAt: number[];
  private readonly feeds: Feed[];
  private readonly outputs: Feed[];
  private readonly ids = new Int32Array(1);
  private readonly positions = new Int32Array(1);
  private readonly mask: Int32Array;
  private readonly slot: Float32Array;
  /** Two sets of cache buffers (per layer k, v): the step reads `caches[current]` and writes the other. */
  private readonly caches: Float32Array[][];
  private current = 0;
  private filled = 0;
  readonly logits: Float32Array;
  readonly profile: GraphDecodeProfile = { steps: 0, runMs: 0, glueMs: 0, compileMs: 0 };

  constructor(
    readonly model: CausalLM,
    options: GraphDecoderOptions = {},
  ) {
    const started = performance.now();
    const c = model.config as { layers: number; kvHeads: number; headDim: number; maxPositions: number; vocabSize: number };
    const capacity = (this.capacity = options.capacity ?? c.maxPositions);
    const kv = [1, c.kvHeads, capacity, c.headDim];
    const past = Array.from({ length: c.layers }, (_, layer) => ({ layer, k: kv, v: kv }));
    const { step, layers } = traceCachedStep(
      model,
      tensor(Int32Array.of(0), [1, 1], 'int32'),
      tensor(Int32Array.of(0), [1, 1], 'int32'),
      tensor(new Int32Array(capacity + 1).fill(1), [1, capacity + 1], 'int32'),
      past,
      zeros([1, 1, capacity, 1]),
    );
    if (layers.length !== c.layers) throw new Error(`the traced step returned the cache of ${layers.length} of ${c.layers} layers`);
    const lowered = lowerStep(step as TracedStep);
    if ('refused' in lowered) throw new Error(`the decoding step does not lower to one graph: ${lowered.refused}`);
    this.session = loadOrtRuntime('ffi').session(lowered.model, options.threads ?? 1, options.spinning ?? false);
    this.mask = new Int32Array(capacity + 1);
    this.slot = new Float32Array(capacity);
    const cacheSize = kv.reduce((a, d) => a * d, 1);
    this.caches = [0, 1].map(() => Array.from({ length: 2 * c.layers }, () => new Float32Array(cacheSize)));
    const own: (Int32Array | Float32Array)[] = [this.ids, this.positions, this.mask, this.slot];
    this.inputAt = new Array<number>(step.inputCount).fill(-1);
    this.feeds = lowered.inputs.map(({ name, slot }, i) => {
      if (slot < step.inputCount) {
        this.inputAt[slot] = i;
        return { name, data: slot < 4 ? own[slot] : this.caches[0][slot - 4], dims: step.slots[slot].shape };
      }
      const t = step.slots[slot].tensor as Tensor;
      const feed = { name, data: t.data as Float32Array | Int32Array, dims: t.shape };
      this.fixed.push(feed);
      return feed;
    });
    // the outputs are the step's: the logits [1, 1, vocab], then each layer's k and v
    this.logits = new Float32Array(c.vocabSize);
    this.outputs = lowered.outputs.map((o, j) => ({ name: o.name, data: j === 0 ? this.logits : this.caches[1][j - 1], dims: o.shape }));
    this.profile.compileMs = performance.now() - started;
  }

  /** Tokens the cache holds. */
  get cached(): number {
    return this.filled;
  }

  /** Forgets the cache (a new sequence). */
  reset(): void {
    this.filled = 0;
  }

  /** The logits after `token` at the next position (a view that the next step overwrites). */
  step(token: number): Float32Array {
    const t0 = performance.now();
    const at = this.filled;
    if (at >= this.capacity) throw new Error(`the cache holds ${this.capacity} tokens`);
    this.ids[0] = token;
    this.positions[0] = at;
    this.mask.fill(0);
    this.mask.fill(1, 0, at);
    this.mask[this.capacity] = 1;
    this.slot.fill(0);
    this.slot[at] = 1;
    const read = this.caches[this.current];
    const written = this.caches[1 - this.current];
    for (let j = 0; j < read.length; j++) {
      const i = this.inputAt[4 + j];
      if (i >= 0) this.feeds[i].data = read[j];
    }
    for (let j = 1; j < this.outputs.length; j++) this.outputs[j].data = written[j - 1];
    const t1 = performance.now();
    this.session.run(this.feeds, this.outputs);
    const t2 = performance.now();
    this.current = 1 - this.current;
    this.filled = at + 1;
    this.profile.steps++;
    this.profile.runMs += t2 - t1;
    this.profile.glueMs += t1 - t0 + (performance.now() - t2);
    return this.logits;
  }
}
