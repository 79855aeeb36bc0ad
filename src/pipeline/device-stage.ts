import { InvalidArgumentError } from '../errors.ts';
import type { Module } from '../nn/index.ts';
import { type ModelLayer, runLayers, SparseMoe } from '../models/index.ts';
import {
  type Backend, backendDevice, type CompiledStep, noGrad, type Tensor, tensor, trace, type TracedStep, zeros,
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
  static refusal(model: Module, backend: Backend): string | null {
    if (backend.compileStep === undefined || backend.allocator?.copyoutSync === undefined) {
      return `backend '${backend.name}' does not run whole steps and read results back at once`;
    }
    for (const [, m] of model.namedModules()) if (m instanceof SparseMoe) return 'a mixture of experts (its experts are stored in the graph)';
    for (const [name, p] of model.namedParameters()) if (p.packed !== null) return `a compact weight (${name})`;
    return null;
  }

  private readonly device: string;
  private readonly steps = new Map<string, { forward: CompiledStep; backward: CompiledStep; out: readonly number[] }>();

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

  /**
   * The compiled steps for inputs shaped as `input` (traced on the host the first time), or null where the device
   * refuses them (an op without a lowering or a gradient there): the section then trains on the CPU.
   */
  private stepsFor(input: Tensor): { forward: CompiledStep; backward: CompiledStep; out: readonly number[] } | null {
    const key = `${input.dtype}[${input.shape}]`;
    const known = this.steps.get(key);
    if (known !== undefined) return known;
    const host = input.dtype === 'int32' ? input : input.detach();
    const forward = noGrad(() => trace((x: Tensor) => this.run(x), [host])).step;
    const out = forward.slots[forward.outputSlots[0]].shape;
    // tracing runs the step once on the host: the parameters' gradients it adds are put back as they were
    const before = this.params.map((p) => p.grad);
    let backward: TracedStep;
    try {
      for (const p of this.params) p.grad = null;
      const leaf = host.dtype === 'int32' ? host : host.detach();
      if (leaf.dtype !== 'int32') leaf.requiresGrad = true;
      backward = trace((x: Tensor, g: Tensor) => {
        const y = this.run(x);
        y.backward(g);
        return y;
      }, [leaf, zeros([...out])]).step;
    } finally {
      this.params.forEach((p, i) => (p.grad = before[i]));
    }
    const [f, b] = [this.backend.compileStep?.(forward) ?? null, this.backend.compileStep?.(backward) ?? null];
    if (f === null || b === null) return null;
    const entry = { forward: f, backward: b, out };
    this.steps.set(key, entry);
    return entry;
  }

  /** The section's output for `input` (host tensors in and out), or null where the device refuses the section's steps. */
  forward(input: Tensor): Tensor | null {
    const steps = this.stepsFor(input);
    if (steps === null) return null;
    const x = input.to(this.device);
    const [y] = steps.forward.run([x]);
    x.dispose();
    const out = hostCopy(y);
    y.dispose();
    return out;
  }

  /**
   * The backward of `input` given the gradient of its output: the parameters' gradients added into their `.grad` (on
   * the host), and the gradient of the input returned (null for token ids). Its forward ran on the device.
   */
  backward(input: Tensor, grad: Tensor): Tensor | null {
    const steps = this.stepsFor(input);
    if (steps === null) throw new InvalidArgumentError(`the backward of a section whose forward did not run on '${this.device}'`);
    if (grad.shape.length !== steps.out.length || grad.shape.some((d, i) => d !== steps.out[i])) {
      throw new InvalidArgumentError(`the gradient [${grad.shape}] does not match the section's output [${steps.out}]`);
    }
    const x = input.to(this.device);
    const dy = grad.to(this.device);
    if (x.dtype !== 'int32') x.requiresGrad = true;
    const [y] = steps.backward.run([x, dy]);
    y.dispose();
    dy.dispose();
    const dx = x.grad === null ? null : hostCopy(x.grad);
    x.grad?.dispose();
    x.dispose();
    return dx;
  }

  /** The weights changed on the host (an optimizer's step): the device reads them again at the next step. */
  refresh(): void {
    this.backend.forget?.(this.params);
  }
}
