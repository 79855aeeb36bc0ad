import { DeviceMismatchError } from '../errors.ts';
import type { Backend } from './backends/backend.ts';
import type { DType, TypedArray } from './dtype.ts';
import type { Tensor } from './tensor.ts';

/**
 * Where a tensor's storage lives (after tinygrad's device.py). `'cpu'` is host memory: the
 * tensor's `data`, a TypedArray that the js and ort backends both compute on. Any other name
 * is a device backend's memory (`'webgpu'`): the backend registered under that name owns it,
 * holds it behind an opaque handle and moves it through its Allocator. Data crosses between
 * the two only when asked: `t.to(device)` in, `await t.toHost()` / `await t.read()` out.
 */
export type Device = 'cpu' | (string & {});

/** Host memory: the device of every tensor whose values sit in a TypedArray. */
export const CPU: Device = 'cpu';

/**
 * A device's memory, as tinygrad's Allocator: `alloc` a buffer, `copyin` host values,
 * `copyout` to host memory, `free` it. `H` is the backend's own handle (an onnxruntime value,
 * a GPUBuffer); the engine never looks inside it. `copyin` may only enqueue the copy (WebGPU's
 * `writeBuffer`); `copyout` is asynchronous because reading a GPU buffer back is.
 */
export interface Allocator<H = unknown> {
  alloc(dtype: DType, length: number): H;
  /** Writes `src` (its length is the buffer's) into the buffer. */
  copyin(handle: H, src: TypedArray): void;
  /** Reads the buffer into `dst` (its length is the buffer's). */
  copyout(handle: H, dst: TypedArray): Promise<void>;
  /** Reads the buffer into `dst` at once, where the device allows a synchronous read (onnxruntime-node's WebGPU does). */
  copyoutSync?(handle: H, dst: TypedArray): void;
  free(handle: H): void;
}

/**
 * The storage of a tensor that lives off the host: a handle from its backend's allocator, with
 * the element type and count it holds. A tensor's storage is host memory (its TypedArray) or
 * this; see `Tensor.device`.
 */
export class DeviceStorage<H = unknown> {
  private freed = false;

  constructor(
    /** The backend that owns the memory; its `device` names where it lives. */
    readonly backend: Backend & { readonly allocator: Allocator<H> },
    readonly handle: H,
    readonly dtype: DType,
    readonly length: number,
  ) {
    reclaim.register(this, { allocator: backend.allocator, handle }, this);
  }

  get device(): Device {
    return this.backend.device ?? CPU;
  }

  /** Returns the memory to the allocator now rather than when the storage is collected. */
  free(): void {
    if (this.freed) return;
    this.freed = true;
    reclaim.unregister(this);
    this.backend.allocator.free(this.handle);
  }
}

/** Device memory whose storage was collected without an explicit free goes back to its allocator. */
const reclaim = new FinalizationRegistry<{ allocator: Allocator<unknown>; handle: unknown }>(({ allocator, handle }) => {
  allocator.free(handle);
});

/** The element types a tensor computes in: `to(x)` converts to one of them, or moves to device x. */
export function isDType(name: string): name is DType {
  return name === 'float32' || name === 'float64' || name === 'int32';
}

/**
 * The one device some tensors live on: a model's or a section's (its parameters'), 'cpu' when
 * there are none; tensors on two devices are a DeviceMismatchError.
 * @example
 * deviceOf(model.parameters()) // 'cpu'
 */
export function deviceOf(tensors: Iterable<Tensor>): Device {
  let device: Device | null = null;
  for (const t of tensors) {
    if (device === null) device = t.device;
    else if (t.device !== device) {
      throw new DeviceMismatchError(`tensors on '${device}' and on '${t.device}' where one device was expected`, {
        details: { devices: [device, t.device] },
      });
    }
  }
  return device ?? CPU;
}
