import { DeviceOpUnsupportedError, TraceError } from '../../../errors.ts';
import { isGradEnabled, record } from '../../autograd.ts';
import { type Allocator, DeviceStorage } from '../../device.ts';
import type { DType, TypedArray } from '../../dtype.ts';
import { addRowBias, matmulJs, type MatmulSpec } from '../../kernels/matmul.ts';
import { Tensor } from '../../tensor.ts';
import type { CompiledStep, TracedStep } from '../../trace.ts';
import type { Backend, Tolerance } from '../backend.ts';
import { type CallGraph, callKey, callTensors, gradientNeeds, lowerCall, lowerCallGradient, OutputIndex } from '../graph/call-graph.ts';
import { type GraphOutput, lowerStep, type StepGraph } from '../graph/step-graph.ts';
import { applyTrainingOutputs, clearGradients, type TrainingEntry } from '../graph/step-training.ts';
import { type GpuSession, type GpuValue, loadWebGpuRuntime } from './runtime.ts';

/**
 * The `webgpu` backend: tensors that live on a GPU, computed by onnxruntime's WebGPU provider
 * (runtime.ts). Its kernels are the graph lowerings (backends/graph/): an op on webgpu tensors
 * runs as a one-op graph (cached by the op, its attributes and its inputs' shapes), and a
 * traced step as one graph of all its ops (`compileStep`), which is how a worker runs a
 * section: one dispatch chain per step instead of one per op. Values stay on the GPU; only
 * `await t.toHost()` reads one back.
 *
 * Gradients: an op on webgpu tensors that need one records an autograd node whose backward runs
 * the gradient of its lowering (graph/gradients.ts) as a graph on the GPU; an op whose gradient
 * cannot be written is refused at the op. What it does not do yet: float64 (refused: GPUs compute in float32), and
 * compact weights on the device (a step's int8/int4 weights are stored in its graph, as
 * MatMulNBits reads them).
 */

/**
 * How far webgpu's results may lie from the js kernels' (relative L2, see Tolerance): float32
 * summed in the GPU's order (tiled products, tree reductions) with its own exp and tanh. The
 * same as ort's (ORT_BACKEND_TOLERANCE, verify's ORT_TOLERANCES: a test checks it), which is what a validator
 * re-running a webgpu record on its CPU compares with: the conformance suite on SwiftShader
 * measures at most a few 1e-7 in float32 (test/tensor/backends/webgpu.test.ts); int8 and int4
 * as ort's. Not yet calibrated on hardware GPUs with 1,000 honest re-runs (#46's note).
 */
export const WEBGPU_TOLERANCE: Tolerance = Object.freeze({ f32: 3e-5, bf16: 3e-5, int8: 0.1, int4: 0.08 });

/** A tensor's memory on the GPU: the value onnxruntime holds, replaced when host values are copied in. */
interface GpuHandle {
  value: GpuValue | null;
  readonly dtype: DType;
  readonly length: number;
}

/** What a webgpu backend did with the traced steps it was offered: how many it compiled, and why it refused the others. */
export interface StepCounts {
  compiled: number;
  refused: string[];
}

export type WebGpuBackend = Backend & { readonly allocator: Allocator<GpuHandle>; readonly steps: StepCounts };

export interface WebGpuBackendOptions {
  /** Called with the reason when a traced step cannot be one graph (it then replays op by op on the device). */
  onRefusal?: (why: string) => void;
}

/** Creates the webgpu backend; throws BackendUnavailableError where there is no WebGPU adapter (the message says what to install). */
export function createWebGpuBackend(options: WebGpuBackendOptions = {}): WebGpuBackend {
  const gpu = loadWebGpuRuntime();
  const calls = new Map<string, { graph: CallGraph; session: GpuSession }>();

  const allocator: Allocator<GpuHandle> = {
    alloc: (dtype, length) => ({ value: null, dtype, length }),
    copyin(handle, src) {
      handle.value?.dispose();
      handle.value = gpu.upload(src, [src.length]);
    },
    async copyout(handle, dst) {
      allocator.copyoutSync!(handle, dst);
    },
    copyoutSync(handle, dst) {
      if (handle.value === null) throw new TraceError('a GPU buffer was read before anything was written to it');
      dst.set(gpu.download(gpu.view(handle.value, [handle.length])) as TypedArray as never);
    },
    free(handle) {
      handle.value?.dispose();
      handle.value = null;
    },
  };

  const steps: StepCounts = { compiled: 0, refused: [] };
  const backend: WebGpuBackend = {
    name: 'webgpu',
    steps,
    device: 'webgpu',
    deterministic: false,
    tolerance: WEBGPU_TOLERANCE,
    allocator,
    runOp(op, args) {
      const call = cachedCall(op, args);
      if (call === null) return undefined;
      const outs = run(call.session, callFeeds(call.graph, callTensors(args)), call.graph.outputs);
      if (isGradEnabled()) recordGradients(op, args, outs);
      return rebuild(call.graph.result, outs);
    },
    compileStep(step) {
      return compileGpuStep(step);
    },
    forget(tensors) {
      for (const t of tensors) {
        uploaded.get(t)?.dispose();
        uploaded.delete(t);
      }
    },
    // a device backend's ops go through runOp; host products run on the CPU context, never here
    matmul(a, b, out, spec: MatmulSpec, bias) {
      matmulJs(a, b, out, spec);
      if (bias) addRowBias(out, bias);
    },
  };

  /** A call's graph and session, made once per key (callKey: the op, its attributes, its inputs' shapes); null where it has no lowering. */
  function cachedCall(op: string, args: readonly unknown[]): { graph: CallGraph; session: GpuSession } | null {
    const key = callKey(op, args);
    let entry = calls.get(key);
    if (entry === undefined) {
      const lowered = lowerCall(op, args);
      if ('refused' in lowered) return null;
      entry = { graph: lowered, session: gpu.session(lowered.model) };
      calls.set(key, entry);
    }
    return entry;
  }

  /** A call graph's feeds: its inputs x<i> are the call's tensors (and, for a gradient graph, the output's gradient last). */
  const callFeeds = (graph: CallGraph, tensors: readonly Tensor[]) =>
    graph.inputNames.map((n) => [n, tensors[Number(n.slice(1))]] as const);

  /** Gradient graphs by call and output, their sessions made at the first backward through them. */
  const gradients = new Map<string, { graph: CallGraph; session: GpuSession | null }>();

  /**
   * Records an autograd node on each float output of a call whose tensors need gradients: its backward runs the call's
   * gradient graph (lowerCallGradient) on the device. The graph is made here, so an op whose gradient cannot be
   * written is refused at the op, not later in backward.
   */
  function recordGradients(op: string, args: readonly unknown[], outs: readonly Tensor[]): void {
    const tensors = callTensors(args);
    const needs = gradientNeeds(op, tensors);
    if (!needs.some(Boolean)) return;
    outs.forEach((out, k) => {
      if (out.dtype !== 'float32') return;
      const key = `${k}:${needs.map(Number).join('')}|${callKey(op, args)}`;
      let entry = gradients.get(key);
      if (entry === undefined) {
        const lowered = lowerCallGradient(op, args, k, needs);
        if ('refused' in lowered) {
          throw new DeviceOpUnsupportedError(`'${op}' on webgpu tensors that require gradients: ${lowered.refused}`, { details: { op, device: 'webgpu' } });
        }
        gradients.set(key, (entry = { graph: lowered, session: null }));
      }
      const gradient = entry;
      record(out, op, tensors.filter((_, i) => needs[i]), (dy) => {
        gradient.session ??= gpu.session(gradient.graph.model);
        const grads = run(gradient.session, callFeeds(gradient.graph, [...tensors, dy]), gradient.graph.outputs);
        const result = gradient.graph.result as (OutputIndex | null)[];
        return result.flatMap((i, k) => (needs[k] ? [i === null ? null : grads[i.index]] : []));
      });
    });
  }

  /** Runs a session on tensors, giving back device tensors for the outputs. */
  function run(session: GpuSession, feeds: readonly (readonly [string, Tensor])[], outputs: readonly GraphOutput[]): Tensor[] {
    const inputs: Record<string, unknown> = {};
    for (const [name, t] of feeds) inputs[name] = gpuValueOf(t);
    const values = session.run(inputs, outputs.map((o) => o.name));
    return outputs.map((o) => deviceTensor(values[o.name], o.type as DType, o.shape));
  }

  function gpuValueOf(t: Tensor): GpuValue {
    const storage = t.deviceStorage;
    if (storage === null || storage.backend !== backend) throw new TraceError(`a tensor on '${t.device}' was fed to a webgpu graph`);
    const handle = storage.handle as GpuHandle;
    if (handle.value === null) throw new TraceError('a GPU buffer was read before anything was written to it');
    return gpu.view(handle.value, t.shape);
  }

  function deviceTensor(value: GpuValue, dtype: DType, shape: readonly number[]): Tensor {
    const length = shape.reduce((a, d) => a * d, 1);
    const handle: GpuHandle = { value, dtype, length };
    return new Tensor(new DeviceStorage(backend, handle, dtype, length), [...shape]);
  }

  /**
   * Host constants of compiled steps (a model's parameters) as copied to the GPU, once per
   * tensor for every step that reads it (a model's graphs for each shape share its weights).
   */
  const uploaded = new WeakMap<object, GpuValue>();
  const upload = (key: Tensor | Float32Array, shape: readonly number[]): GpuValue => {
    let v = uploaded.get(key);
    if (v === undefined) uploaded.set(key, (v = gpu.upload(key instanceof Tensor ? key.data : key, shape)));
    return v;
  };

  /**
   * A traced step as one graph on the GPU. Its inputs are the step's inputs, on webgpu. Its
   * constants (parameters) are copied to the GPU the first time a step reads them, and that
   * copy is what every step computes with (an update of the host tensor by other code is not
   * seen: trace and compile again). A training step's updates (step-training.ts) are kept on
   * the GPU for the next run and written back to the host parameters and moments after each
   * run, so the host copies stay true (a download of the trained weights and moments per step).
   */
  function compileGpuStep(step: TracedStep): CompiledStep | null {
    const lowered = lowerStep(step);
    if ('refused' in lowered) {
      steps.refused.push(lowered.refused);
      options.onRefusal?.(lowered.refused);
      return null;
    }
    const session = gpu.session(lowered.model);
    steps.compiled++;
    const constant = (t: Tensor): GpuValue => (t.deviceStorage === null ? upload(t, t.shape) : gpuValueOf(t));
    return {
      run(inputs) {
        for (const guard of lowered.effects.guards) guard();
        const feeds: Record<string, unknown> = {};
        for (const { name, slot } of lowered.inputs) {
          feeds[name] = slot < step.inputCount ? gpuValueOf(inputs[slot]) : constant(step.slots[slot].tensor!);
        }
        for (const e of lowered.extraInputs) feeds[e.name] = upload(e.source, e.shape);
        const hyper = lowered.feeds.map((f) => gpu.upload(f.value(), f.shape));
        lowered.feeds.forEach((f, i) => (feeds[f.name] = hyper[i]));
        const values = session.run(feeds, [...lowered.outputs, ...lowered.training].map((o) => o.name));
        for (const h of hyper) h.dispose();
        applyOnGpu(lowered.training, values, inputs);
        clearGradients(lowered.effects.clears);
        return lowered.outputs.map((o) => deviceTensor(values[o.name], o.type as DType, o.shape));
      },
    };
  }

  /**
   * A training step's outputs (step-training.ts) after a run: for a parameter on the GPU, its gradient summed there
   * and its new value swapped into its memory; for host parameters and moments, the new values kept as their GPU copy
   * and written back to the host, and gradients added into the host `.grad`.
   */
  function applyOnGpu(outputs: StepGraph['training'], values: Record<string, GpuValue>, inputs: readonly Tensor[]): void {
    const host: TrainingEntry[] = [];
    const hostValues: Float32Array[] = [];
    for (const o of outputs) {
      const value = values[o.name];
      const t = o.kind === 'inputGrad' ? inputs[o.target] : o.target;
      const storage = t instanceof Tensor ? t.deviceStorage : null;
      if (o.kind === 'inputGrad' && !inputs[o.target].requiresGrad) value.dispose();
      else if (storage !== null && t instanceof Tensor) {
        if (o.kind === 'write') {
          const handle = storage.handle as GpuHandle;
          handle.value?.dispose();
          handle.value = value;
        } else {
          const grad = deviceTensor(value, 'float32', o.shape);
          const old = t.grad;
          t.grad = old === null || o.kind === 'setGrad' ? grad : (backend.runOp!('add', [old, grad]) as Tensor);
          if (old !== null) old.dispose();
          if (t.grad !== grad) grad.dispose();
        }
      } else {
        host.push(o);
        hostValues.push(new Float32Array(gpu.download(value) as Float32Array));
        if (o.kind === 'write') {
          uploaded.get(o.target)?.dispose();
          uploaded.set(o.target, value);
        } else value.dispose();
      }
    }
    applyTrainingOutputs(host, hostValues, inputs);
  }

  return backend;
}

/** What an op returns, its GraphOutput indices replaced by the tensors computed. */
function rebuild(template: unknown, outs: readonly Tensor[]): unknown {
  if (template instanceof OutputIndex) return outs[template.index];
  if (Array.isArray(template)) return template.map((t) => rebuild(t, outs));
  if (typeof template === 'object' && template !== null) return Object.fromEntries(Object.entries(template).map(([k, v]) => [k, rebuild(v, outs)]));
  return template;
}
