import { DeviceOpUnsupportedError, TensorLinkError } from '../../errors.ts';
import { cat, type Device, loadBackend, noGrad, type Tensor, tensor, type TracedStep, trace, zeros } from '../../tensor/index.ts';
import { type CausalLM, type ForwardOptions, KVCache, type LayerCache } from '../model.ts';
import type { StepModel } from './generate.ts';

/**
 * A model (or a section) run on a device backend (webgpu), a step at a time: each call is a
 * step traced once on the host (its CPU context) for its shapes and compiled by the device's backend into
 * one graph (Backend.compileStep), then run there. The KV cache lives on the device: a step
 * takes the cached keys and values as inputs and returns them grown (the models join them with
 * `cat` while a trace records), so only the step's input goes up and its output comes down.
 *
 * Shapes are static in a graph: a step is traced (the trace runs the model once on the host's js
 * kernels) and compiled for each shape it meets. So that a few graphs serve every length, where
 * the model's masks allow it (not a sliding window, not ALiBi): a first prompt is padded at its
 * end to a power of two of positions (32, 64, …), and decoding runs on a bounded cache (one graph
 * per capacity, below). Elsewhere, a graph per prompt length and per decoded position.
 */
export class DeviceRunner implements StepRunner {
  /** The cache on the device: per layer index of the model, its keys and values [B, kvHeads, T, D]. */
  private readonly cache: (LayerCache | null)[];
  /** The model's traced steps by shape, shared by every runner of the model (a worker's sessions): each compiled once. */
  private readonly steps: Map<string, TracedStep<Tensor[]>>;

  constructor(
    readonly model: CausalLM,
    readonly device: Device,
  ) {
    this.cache = new Array<LayerCache | null>(model.config.layers).fill(null);
    let steps = modelSteps.get(model);
    if (steps === undefined) modelSteps.set(model, (steps = new Map()));
    this.steps = steps;
  }

  /** Tokens the device cache holds (its tensors may have room for more: a bounded cache). */
  private filled = 0;

  get cached(): number {
    return this.filled;
  }

  /** Forgets the cache (a new sequence). */
  reset(): void {
    for (const e of this.cache) {
      e?.k.dispose();
      e?.v.dispose();
    }
    this.cache.fill(null);
    this.filled = 0;
  }

  /**
   * The model's output for `input` (host: ids [B, T] or hidden states [B, T, H]) after what the
   * cache holds, read back to the host; the cache grows on the device.
   * @example
   * const runner = new DeviceRunner(model, 'webgpu')
   * const logits = await runner.step(tensor([[15496, 11]], [1, 2], 'int32'))
   */
  async step(input: Tensor, options: Omit<ForwardOptions, 'cache'> = {}): Promise<Tensor> {
    const past = this.cache.flatMap((e, i) => (e ? [i] : []));
    if (input.shape[1] === 1 && past.length > 0 && boundedDecoding(this.model)) return this.boundedStep(input, options, past);
    const t = input.shape[1];
    // never past the model's positions (a learned position table ends there)
    const bucket = Math.min(Math.max(MIN_SLOTS, 2 ** Math.ceil(Math.log2(t))), this.model.config.maxPositions);
    const plain = startsPlain(options, input.shape[0], t);
    if (past.length === 0 && t > 1 && bucket > t && plain && boundedDecoding(this.model)) {
      // a prompt padded at its end to a power of two (from MIN_SLOTS): one graph per bucket, not per length; causal
      // attention keeps the padding out of the real positions, and its keys are masked out as empty slots after
      const y = this.exactStep(padTime(input, bucket), {}, past);
      this.filled = t;
      const real = noGrad(() => y.narrow(1, 0, t));
      y.dispose();
      const out = await real.toHost();
      real.dispose();
      return out;
    }
    const y = this.exactStep(input, options, past);
    const out = await y.toHost();
    y.dispose();
    return out;
  }

  /** A step on the cache as it is filled (no bounded slots): its output, on the device. */
  private exactStep(input: Tensor, options: Omit<ForwardOptions, 'cache'>, past: readonly number[]): Tensor {
    // the exact path takes the cache as long as it is filled
    this.fit(this.filled);
    const positions = options.positions ?? null;
    const keyMask = options.keyMask ?? null;
    const key = [
      input.dtype,
      input.shape.join('x'),
      past.join(','),
      this.cached,
      positions === null ? '-' : positions.data.join(','),
      keyMask === null ? '-' : `${keyMask.shape.join('x')}:${keyMask.data.join('')}`,
    ].join('|');
    let traced = this.steps.get(key);
    if (traced === undefined) {
      traced = this.traceStep(input, positions, keyMask, past);
      this.steps.set(key, traced);
    }
    const inputs = [input.to(this.device)];
    if (positions !== null) inputs.push(positions.to(this.device));
    if (keyMask !== null) inputs.push(keyMask.to(this.device));
    for (const i of past) inputs.push(this.cache[i]!.k, this.cache[i]!.v);
    const [y, ...grown] = this.run(traced, inputs);
    for (const t of inputs.slice(0, inputs.length - 2 * past.length)) t.dispose();
    const layers = grown.length / 2;
    const held = this.heldLayers(traced, layers);
    for (let j = 0; j < layers; j++) {
      const old = this.cache[held[j]];
      old?.k.dispose();
      old?.v.dispose();
      this.cache[held[j]] = { k: grown[2 * j], v: grown[2 * j + 1] };
    }
    this.filled = grown[0]?.shape[2] ?? this.filled;
    return y;
  }

  /**
   * One token's step on a bounded cache: the cache's tensors hold C slots (a power of two, grown
   * when full), the keys mask says which are filled, and the step writes the new key and value
   * into slot `filled`: one graph for every position up to C (forward.ts, LayerCache.slot).
   */
  private async boundedStep(input: Tensor, options: Omit<ForwardOptions, 'cache'>, past: readonly number[]): Promise<Tensor> {
    const b = input.shape[0];
    const at = this.filled;
    const capacity = Math.max(MIN_SLOTS, 2 ** Math.ceil(Math.log2(at + 1)));
    this.fit(Math.max(capacity, this.capacity()));
    const slots = this.capacity();
    const positions = options.positions ?? tensor(new Int32Array(b).fill(at), [b, 1], 'int32');
    // the keys: the filled slots (as the caller's mask says, if it gave one), the empty ones, then the new key
    const given = options.keyMask ?? null;
    const mask = new Int32Array(b * (slots + 1));
    for (let r = 0; r < b; r++) {
      for (let j = 0; j < at; j++) mask[r * (slots + 1) + j] = given === null ? 1 : given.data[r * (at + 1) + j];
      mask[r * (slots + 1) + slots] = given === null ? 1 : given.data[r * (at + 1) + at];
    }
    const keyMask = tensor(mask, [b, slots + 1], 'int32');
    const slot = zeros([1, 1, slots, 1]);
    slot.data[at] = 1;
    const key = ['bounded', input.dtype, input.shape.join('x'), past.join(','), slots].join('|');
    let traced = this.steps.get(key);
    if (traced === undefined) {
      traced = this.traceStep(input, positions, keyMask, past, slot);
      // a step that does not read its positions holds position-dependent values as constants (rotary tables computed on
      // the host): it would give every later position the traced one's, so this model decodes a graph per position
      if (!traced.ops.some((op) => op.inputSlots.includes(1))) {
        unbounded.add(this.model);
        return this.step(input, options);
      }
      this.steps.set(key, traced);
    }
    const inputs = [input, positions, keyMask, slot].map((t) => t.to(this.device));
    for (const i of past) inputs.push(this.cache[i]!.k, this.cache[i]!.v);
    const [y, ...grown] = this.run(traced, inputs);
    for (const t of inputs.slice(0, 4)) t.dispose();
    const held = this.heldLayers(traced, grown.length / 2);
    held.forEach((layer, j) => {
      const old = this.cache[layer];
      old?.k.dispose();
      old?.v.dispose();
      this.cache[layer] = { k: grown[2 * j], v: grown[2 * j + 1] };
    });
    this.filled = at + 1;
    const out = await y.toHost();
    y.dispose();
    return out;
  }

  /** Slots the cache's tensors have (0 when empty). */
  private capacity(): number {
    for (const e of this.cache) if (e) return e.k.shape[2];
    return 0;
  }

  /** Gives the cache's tensors `slots` slots on the device: the filled ones kept, empty ones added (zeros) or cut. */
  private fit(slots: number): void {
    const have = this.capacity();
    if (have === slots || have === 0) return;
    this.cache.forEach((e, i) => {
      if (e === null) return;
      const resize = (t: Tensor) => {
        if (slots < have) return noGrad(() => t.narrow(2, 0, slots));
        const [b, h, , d] = t.shape;
        const room = zeros([b, h, slots - have, d]).to(this.device);
        const grown = noGrad(() => cat([t, room], 2));
        room.dispose();
        return grown;
      };
      const k = resize(e.k);
      const v = resize(e.v);
      e.k.dispose();
      e.v.dispose();
      this.cache[i] = { k, v };
    });
  }

  /** Runs a traced step on the device; a step the device cannot take is a DeviceOpUnsupportedError that says why. */
  private run(traced: TracedStep<Tensor[]>, inputs: Tensor[]): Tensor[] {
    try {
      return noGrad(() => traced.run(inputs));
    } catch (err) {
      if (!(err instanceof TensorLinkError) || !/^Device/.test(err.name)) throw err;
      // the step was not compiled, and replaying it op by op on the device met an op that cannot run there
      const refused = (loadBackend(this.device) as { steps?: { refused: string[] } }).steps?.refused.at(-1);
      throw new DeviceOpUnsupportedError(
        `this model's step does not run on '${this.device}'${refused === undefined ? '' : `: ${refused}`}; run it on the CPU (--backend ort or js)`,
        { cause: err, details: { device: this.device } },
      );
    }
  }

  /** Which layer index each grown (k, v) pair of a step belongs to (noted when it was traced). */
  private heldLayers(step: TracedStep<Tensor[]>, count: number): number[] {
    const held = traceLayers.get(step);
    if (held === undefined || held.length !== count) throw new Error('a traced step lost track of its cache layers');
    return held;
  }

  /** Traces one step on the host for these shapes: inputs (x, positions?, keyMask?, past k/v…), outputs [y, k/v…]. */
  private traceStep(
    input: Tensor, positions: Tensor | null, keyMask: Tensor | null, past: readonly number[], slot: Tensor | null = null,
  ): TracedStep<Tensor[]> {
    const shapes = past.map((layer) => ({ layer, k: this.cache[layer]!.k.shape, v: this.cache[layer]!.v.shape }));
    const { step, layers } = traceCachedStep(this.model, input, positions, keyMask, shapes, slot);
    traceLayers.set(step, layers);
    return step;
  }
}

/** A prompt at positions 0 … t − 1 of every row with every key kept: what a prompt with no options is. */
function startsPlain(options: Omit<ForwardOptions, 'cache'>, b: number, t: number): boolean {
  const { positions, keyMask } = options;
  if (keyMask && keyMask.data.some((v) => v !== 1)) return false;
  if (positions && (positions.size !== b * t || positions.data.some((p, i) => p !== i % t))) return false;
  return true;
}

/** `x` (ids [B, T] or hidden states [B, T, H], on the host) with zeros after its T positions, to `length`. */
function padTime(x: Tensor, length: number): Tensor {
  const [b, t] = x.shape;
  const width = x.size / (b * t);
  const out = zeros([b, length, ...x.shape.slice(2)], x.dtype);
  for (let r = 0; r < b; r++) out.data.set(x.data.subarray(r * t * width, (r + 1) * t * width), r * length * width);
  return out;
}

/** The cache a step starts from: for each layer that holds one, the shapes of its keys and values. */
export interface PastShape {
  layer: number;
  k: readonly number[];
  v: readonly number[];
}

/**
 * One step of `model` traced on the host (its CPU context) for these shapes, with its KV cache as inputs and
 * outputs: inputs (x, positions?, keyMask?, then each past layer's k and v), outputs [y, then
 * k and v of each layer the cache holds after the step, in `layers` order]. The past values
 * are zeros of the shapes given: a trace records ops, not values. What a device runner (this
 * file's DeviceRunner, the tab's) compiles and runs.
 * @example
 * const { step, layers } = traceCachedStep(model, ids, null, null, [])  // a prompt: no past
 */
export function traceCachedStep(
  model: CausalLM,
  input: Tensor,
  positions: Tensor | null,
  keyMask: Tensor | null,
  past: readonly PastShape[],
  slot: Tensor | null = null,
): { step: TracedStep<Tensor[]>; layers: number[] } {
  const dummies = past.flatMap((p) => [zeros([...p.k]), zeros([...p.v])]);
  let layers: number[] = [];
  const fn = (...xs: Tensor[]): Tensor[] => {
    let at = 1;
    const pos = positions === null ? null : xs[at++];
    const mask = keyMask === null ? null : xs[at++];
    const written = slot === null ? undefined : xs[at++];
    const cache = new KVCache(model.config.layers);
    past.forEach((p, j) => (cache.layers[p.layer] = { k: xs[at + 2 * j], v: xs[at + 2 * j + 1], ...(written ? { slot: written } : {}) }));
    const y = model.forward(xs[0], { cache, positions: pos, keyMask: mask });
    layers = cache.layers.flatMap((e, i) => (e ? [i] : []));
    return [y, ...layers.flatMap((i) => [cache.layers[i]!.k, cache.layers[i]!.v])];
  };
  const hostInputs = [input, ...(positions ? [positions] : []), ...(keyMask ? [keyMask] : []), ...(slot ? [slot] : []), ...dummies];
  // traced on the CPU context (ort where it loads: a large model's trace runs its step once on the host)
  const { step } = noGrad(() => trace(fn, hostInputs));
  return { step, layers };
}

/** Traced steps by model and key (see DeviceRunner.steps). */
const modelSteps = new WeakMap<CausalLM, Map<string, TracedStep<Tensor[]>>>();

/** A bounded cache has at least this many slots (then 64, 128, …): a graph for each, not one per position. */
const MIN_SLOTS = 32;

/**
 * Whether a model's decoding steps can run on a bounded cache (one graph for every position): not where the keys a
 * token sees depend on its index in the cache rather than its position (a sliding window, masked by index; BLOOM's
 * ALiBi, a bias by distance computed on the host).
 */
function boundedDecoding(model: CausalLM): boolean {
  const c = model.config as { slidingWindow?: number; arch: string };
  return c.slidingWindow === undefined && c.arch !== 'bloom' && !unbounded.has(model);
}

/** Models whose bounded step did not read its positions (see boundedStep): they decode a graph per position. */
const unbounded = new WeakSet<CausalLM>();

/** The layer indices of the cache entries a traced step returns, in order. */
const traceLayers = new WeakMap<TracedStep<Tensor[]>, number[]>();

/**
 * Generation's step model for a model run on a device (see DeviceRunner): `generate` and
 * `generateWith` drive it as they drive a local model.
 * @example
 * const [tokens] = await generateWith(deviceStepModel(model, 'webgpu'), [prompt], { temperature: 0 })
 */
export function deviceStepModel(model: CausalLM, device: Device): StepModel {
  const runner = new DeviceRunner(model, device);
  return {
    maxPositions: model.config.maxPositions,
    eosTokenId: model.tokenizer?.eosTokenId ?? model.config.eosTokenId ?? null,
    step: (ids, options) => runner.step(ids, options),
  };
}

/** What runs a session's steps on a device: a DeviceRunner, or what a platform registers for its device (the browser tab's). */
export interface StepRunner {
  /** Tokens its cache holds. */
  readonly cached: number;
  /** The model's output for `input` after what the cache holds, on the host; the cache grows. */
  step(input: Tensor, options?: Omit<ForwardOptions, 'cache'>): Promise<Tensor>;
  /** Forgets the cache (a new sequence). */
  reset(): void;
}

const runnerFactories = new Map<Device, (model: CausalLM) => StepRunner>();

/**
 * Makes `device`'s sessions run on `make`'s runners instead of a DeviceRunner: a device whose
 * runtime is asynchronous (onnxruntime-web in a browser tab) cannot compile a step synchronously.
 * @example
 * registerStepRunner('browser-webgpu', (model) => new TabGpuRunner(model, gpu))
 */
export function registerStepRunner(device: Device, make: (model: CausalLM) => StepRunner): void {
  runnerFactories.set(device, make);
}

/**
 * The runner of a session's steps on `device`: the one registered for it, else a DeviceRunner.
 * @example
 * const runner = deviceRunner(section.model, computeDevice())
 */
export function deviceRunner(model: CausalLM, device: Device): StepRunner {
  return runnerFactories.get(device)?.(model) ?? new DeviceRunner(model, device);
}
