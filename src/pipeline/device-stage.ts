import { InvalidArgumentError } from '../errors.ts';
import type { Module } from '../nn/index.ts';
import { type ModelLayer, runLayers, SparseMoe } from '../models/index.ts';
import {
  type Backend, backendDevice, type CompiledStep, noGrad, type Tensor, tensor, trace, type TracedStep,
} from '../tensor/index.ts';

/** A device tensor's values on the host, read at once (the stage protocol's handlers run between awaits of their own). */
function hostCopy(t: Tensor): Tensor {
  const storage = t.deviceStorage;
  if (storage === null) return t;
  if (storage.dtype !== 'float32') throw new InvalidArgumentError(`a ${storage.dtype} tensor on '${t.device}' where a float32 one was expected`);
  const read = storage.backend.allocator.copyoutSync;
  if (read === undefined) throw new InvalidArgumentError(`tensors on '${t.device}' cannot be read at once: train this section on the CPU`);
  const out = new Float32Array(storage.length);
  read.call(storage.backend.allocator, storage.handle, out);
  return tensor(out, t.shape);
}

/**
 * A training section's forward and backward on a device (a worker with `--backend webgpu`), each micro-batch shape's
 * steps traced once on the CPU context and compiled as one graph there: the forward (no gradients), and the backward as forward
 * and backward together (the forward recomputed inside the graph: activation checkpointing, so no activations are
 * held between the two), whose parameter gradients the graph adds into the host `.grad` and whose input gradient it
 * gives back. The optimizer steps on the host (the executor's AdamW, as on a CPU worker: records, replicas and
 * checkpoints read the same state); `refresh` then tells the device that the weights changed.
 */
export class DeviceSection {
  /**
   * Why a section cannot train on a device (it then trains on the CPU), or null: a compact (int8/int4) weight, whose
   * gradient is not lowered, or a mixture of experts, whose experts its graph stores.
   */
  static refusal(model: Module): string | null {
    for (const [, m] of model.namedModules()) if (m instanceof SparseMoe) return 'a mixture of experts (its experts are stored in the graph)';
    for (const [name, p] of model.namedParameters()) if (p.packed !== null) return `a compact weight (${name})`;
    return null;
  }

  private readonly device: string;
  private readonly steps = new Map<string, { forward: CompiledStep; backward: CompiledStep }>();

  constructor(
    private readonly layers: readonly ModelLayer[],
    private readonly maxPositions: number,
    private readonly backend: Backend,
    private readonly params: readonly Tensor[],
  ) {
    this.device = backendDevice(backend);
  }

  private run(input: Tensor): Tensor {
    return runLayers(this.layers, input, {}, this.maxPositions);
  }

  /** The compiled steps for inputs shaped as `input` (traced on the host the first time, with `grad` shaped as the output). */
  private stepsFor(input: Tensor, grad: Tensor | null): { forward: CompiledStep; backward: CompiledStep } {
    const key = `${input.dtype}[${input.shape}]`;
    let entry = this.steps.get(key);
    if (entry !== undefined) return entry;
    const compile = (step: TracedStep, what: string): CompiledStep => {
      const compiled = this.backend.compileStep?.(step) ?? null;
      if (compiled === null) throw new InvalidArgumentError(`this section's ${what} cannot run as one graph on '${this.device}'; train it on the CPU`);
      return compiled;
    };
    const host = input.dtype === 'int32' ? input : input.detach();
    const forward = noGrad(() => trace((x: Tensor) => this.run(x), [host])).step;
    const outShape = forward.slots[forward.outputSlots[0]].shape;
    const seed = grad ?? noGrad(() => this.run(host));
    if (seed.shape.some((d, i) => d !== outShape[i])) throw new InvalidArgumentError(`a gradient [${seed.shape}] for an output [${outShape}]`);
    // tracing runs the step once on js: the parameters' gradients it adds are put back as they were
    const before = this.params.map((p) => p.grad);
    for (const p of this.params) p.grad = null;
    const leaf = host.dtype === 'int32' ? host : host.detach();
    if (leaf.dtype !== 'int32') leaf.requiresGrad = true;
    const backward = trace((x: Tensor, g: Tensor) => {
      const y = this.run(x);
      y.backward(g);
      return y;
    }, [leaf, seed.detach()]).step;
    this.params.forEach((p, i) => (p.grad = before[i]));
    entry = { forward: compile(forward, 'forward'), backward: compile(backward, 'backward') };
    this.steps.set(key, entry);
    return entry;
  }

  /** The section's output for `input` (host tensors in and out). */
  forward(input: Tensor): Tensor {
    const { forward } = this.stepsFor(input, null);
    const [y] = forward.run([input.to(this.device)]);
    return hostCopy(y);
  }

  /**
   * The backward of `input` given the gradient of its output: the parameters' gradients added into their `.grad` (on
   * the host), and the gradient of the input returned (null for token ids).
   */
  backward(input: Tensor, grad: Tensor): Tensor | null {
    const { backward } = this.stepsFor(input, grad);
    const x = input.to(this.device);
    if (x.dtype !== 'int32') x.requiresGrad = true;
    backward.run([x, grad.to(this.device)]);
    return x.grad === null ? null : hostCopy(x.grad);
  }

  /** The weights changed on the host (an optimizer's step): the device reads them again at the next step. */
  refresh(): void {
    this.backend.forget?.(this.params);
  }
}
