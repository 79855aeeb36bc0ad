// browser-webgpu: a tab's sessions run each step of its section as one ONNX graph on its GPU (onnxruntime-web's WebGPU
// provider), as a Node GPU worker's DeviceRunner does (src/models/generation/device-step.ts), but asynchronously:
// onnxruntime-web runs a graph with a promise. A step is traced once per shape on the host (js) and lowered to one
// graph (the lowerings of src/tensor/backends/graph/); the model's parameters are the graph's constant inputs, copied
// to the GPU once. The KV cache stays on the GPU: a step takes it as inputs and returns it grown there, so only the
// step's input goes up and its output comes down.
import { DeviceOpUnsupportedError } from '../errors.ts';
import { type CausalLM, type ForwardOptions, registerStepRunner, type StepRunner, traceCachedStep } from '../models/index.ts';
import {
  type Backend, type DType, jsBackend, lowerStep, ORT_BACKEND_TOLERANCE, registerBackend, setComputeDevice, type StepGraph, Tensor, type TracedStep,
  type TypedArray,
} from '../tensor/index.ts';

import * as ort from 'onnxruntime-web/webgpu';
import type { GpuGraph, TabGpu } from './gpu.ts';

/** The device (and backend) name a tab on its GPU computes under: what its records and capabilities say. */
export const BROWSER_WEBGPU = 'browser-webgpu';

/** Steps compiled per model: one for each shape met (a prompt, then each decoded position); the oldest are released. */
const MAX_STEPS = 96;

/** A step traced, lowered and loaded on the GPU, with the cache layers it returns grown (in order). */
interface GpuStep {
  step: TracedStep<Tensor[]>;
  graph: StepGraph;
  session: GpuGraph;
  layers: number[];
  /** The step's constants (the model's parameters), as onnxruntime-web values made once. */
  constants: Map<string, ort.Tensor>;
}

/** A layer's cached keys and values on the GPU, [B, kvHeads, T, D]. */
interface GpuLayerCache {
  k: ort.Tensor;
  v: ort.Tensor;
}

/** A runner collected without being reset (its session dropped) frees its cache on the GPU. */
const unreferenced = new FinalizationRegistry<(GpuLayerCache | null)[]>((cache) => freeCache(cache));

function freeCache(cache: (GpuLayerCache | null)[]): void {
  for (const e of cache) {
    e?.k.dispose();
    e?.v.dispose();
  }
  cache.fill(null);
}

/** The compiled steps of each model, shared by its sessions (a new session meets the shapes the last one did). */
const compiled = new WeakMap<CausalLM, Map<string, Promise<GpuStep>>>();

/**
 * A session of a section on the tab's GPU: its KV cache (there) and the step for each shape.
 * @example
 * const runner = new TabGpuRunner(model, gpu)
 * const logits = await runner.step(ids)
 */
export class TabGpuRunner implements StepRunner {
  private readonly cache: (GpuLayerCache | null)[];

  constructor(
    readonly model: CausalLM,
    private readonly gpu: TabGpu,
  ) {
    this.cache = new Array<GpuLayerCache | null>(model.config.layers).fill(null);
    unreferenced.register(this, this.cache, this);
  }

  get cached(): number {
    for (const e of this.cache) if (e) return e.k.dims[2];
    return 0;
  }

  reset(): void {
    freeCache(this.cache);
  }

  async step(input: Tensor, options: Omit<ForwardOptions, 'cache'> = {}): Promise<Tensor> {
    const past = this.cache.flatMap((e, i) => (e ? [i] : []));
    const positions = options.positions ?? null;
    const keyMask = options.keyMask ?? null;
    const key = [
      input.dtype, input.shape.join('x'), past.join(','), this.cached,
      positions === null ? '-' : positions.data.join(','),
      keyMask === null ? '-' : `${keyMask.shape.join('x')}:${keyMask.data.join('')}`,
    ].join('|');
    let steps = compiled.get(this.model);
    if (steps === undefined) compiled.set(this.model, (steps = new Map()));
    let pending = steps.get(key);
    if (pending === undefined) {
      pending = this.compile(input, positions, keyMask, past);
      steps.set(key, pending);
      pending.catch(() => steps.delete(key));
      if (steps.size > MAX_STEPS) {
        const [oldest, old] = steps.entries().next().value!;
        steps.delete(oldest);
        void old.then((s) => s.session.release()).catch(() => undefined);
      }
    }
    const s = await pending;
    const inputs = [input, ...(positions ? [positions] : []), ...(keyMask ? [keyMask] : [])].map(ortValue);
    for (const i of past) inputs.push(this.cache[i]!.k, this.cache[i]!.v);
    const feeds: Record<string, ort.Tensor> = {};
    for (const { name, slot } of s.graph.inputs) feeds[name] = slot < s.step.inputCount ? inputs[slot] : s.constants.get(name)!;
    const values = await s.session.run(feeds);
    const [first, ...rest] = s.graph.outputs;
    const grown = rest.map((o) => checked(values[o.name], o.type as DType, o.shape));
    s.layers.forEach((layer, j) => {
      const old = this.cache[layer];
      old?.k.dispose();
      old?.v.dispose();
      this.cache[layer] = { k: grown[2 * j], v: grown[2 * j + 1] };
    });
    const y = checked(values[first.name], first.type as DType, first.shape);
    return new Tensor(y.data as TypedArray, [...first.shape]);
  }

  /** Traces the step on the host for these shapes, lowers it to one graph and loads it on the GPU. */
  private async compile(input: Tensor, positions: Tensor | null, keyMask: Tensor | null, past: readonly number[]): Promise<GpuStep> {
    const shapes = past.map((layer) => ({ layer, k: this.cache[layer]!.k.dims, v: this.cache[layer]!.v.dims }));
    const { step, layers } = traceCachedStep(this.model, input, positions, keyMask, shapes);
    const graph = lowerStep(step);
    if ('refused' in graph) {
      throw new DeviceOpUnsupportedError(`this section's step cannot run as one graph on ${BROWSER_WEBGPU}: ${graph.refused}`, {
        details: { device: BROWSER_WEBGPU },
      });
    }
    const constants = new Map<string, ort.Tensor>();
    for (const { name, slot } of graph.inputs) if (slot >= step.inputCount) constants.set(name, await this.constantValue(step.slots[slot].tensor!));
    // the grown cache stays on the GPU; the step's output comes down
    const session = await this.gpu.load(graph.model, graph.outputs.slice(1).map((o) => o.name));
    return { step, graph, session, layers, constants };
  }

  /** A parameter on the GPU, copied there once for every step (and session) that reads it. */
  private constantValue(t: Tensor): Promise<ort.Tensor> {
    let v = onGpu.get(t);
    if (v === undefined) {
      v = this.gpu.upload(t.data as Float32Array | Int32Array, t.shape);
      onGpu.set(t, v);
      // freed on the GPU when the host tensor is collected (its model dropped)
      void v.then((value) => released.register(t, value));
    }
    return v;
  }
}

/** A host tensor as an onnxruntime-web value (its values shared, not copied). */
function ortValue(t: Tensor): ort.Tensor {
  return new ort.Tensor(t.dtype === 'int32' ? 'int32' : 'float32', t.data as Float32Array | Int32Array, [...t.shape]);
}

/** Parameters on the GPU, by host tensor. */
const onGpu = new WeakMap<Tensor, Promise<ort.Tensor>>();
const released = new FinalizationRegistry<ort.Tensor>((value) => value.dispose());

/** An output, checked against the shape and type the trace gave it. */
function checked(v: ort.Tensor, dtype: DType, shape: readonly number[]): ort.Tensor {
  if (v.type !== dtype || v.dims.length !== shape.length || v.dims.some((d, i) => d !== shape[i])) {
    throw new Error(`a graph on ${BROWSER_WEBGPU} gave ${v.type} [${v.dims.join(', ')}] where the trace has ${dtype} [${shape.join(', ')}]`);
  }
  return v;
}

/**
 * Makes the Web Worker's sessions run on the tab's GPU: a device backend named browser-webgpu (its tensors stay on
 * the host: the runner is what computes there; a validator compares its records within onnxruntime's tolerance) is
 * the node's compute device, and its sessions run as TabGpuRunners.
 * @example
 * const gpu = await openTabGpu()
 * if (typeof gpu !== 'string') computeOnTabGpu(gpu)
 */
export function computeOnTabGpu(gpu: TabGpu): void {
  const backend: Backend = {
    name: BROWSER_WEBGPU,
    device: BROWSER_WEBGPU,
    deterministic: false,
    tolerance: ORT_BACKEND_TOLERANCE,
    allocator: {
      alloc: (dtype: DType, length: number) => ({ data: (dtype === 'int32' ? new Int32Array(length) : new Float32Array(length)) as TypedArray }),
      copyin: (h: { data: TypedArray }, src: TypedArray) => h.data.set(src as never),
      copyout: async (h: { data: TypedArray }, dst: TypedArray) => dst.set(h.data as never),
      free: () => undefined,
    } as Backend['allocator'],
    // ops on its tensors are not run one by one: a session's steps are whole graphs (TabGpuRunner)
    runOp: () => undefined,
    matmul: (a, b, out, spec, bias) => jsBackend.matmul(a, b, out, spec, bias),
  };
  registerBackend(BROWSER_WEBGPU, () => backend);
  registerStepRunner(BROWSER_WEBGPU, (model) => new TabGpuRunner(model, gpu));
  setComputeDevice(BROWSER_WEBGPU);
}
