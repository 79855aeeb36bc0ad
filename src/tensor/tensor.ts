import { AutogradError, DeviceDataError, DTypeError, InvalidArgumentError, ShapeMismatchError } from '../errors.ts';
import { type BackwardOptions, type GradNode, runBackward } from './autograd.ts';
import { backendNames, loadBackend } from './backends/registry.ts';
import type { Backend } from './backends/backend.ts';
import { type Allocator, CPU, type Device, DeviceStorage, isDType } from './device.ts';
import { activeRecorder, hook, hooked, noteDeviceTensor, TENSOR_MARK } from './dispatch.ts';
import { allocate, type DType, dtypeOf, type FloatArray, isFloat, type TypedArray } from './dtype.ts';
import { addInto } from './kernels/rows.ts';
import * as ew from './ops/elementwise.ts';
import * as mm from './ops/matmul.ts';
import * as red from './ops/reduce.ts';
import * as sh from './ops/shape.ts';
import * as sm from './ops/softmax.ts';
import type { PackedMatrix } from './quant/formats.ts';
import { type Shape, sizeOf } from './shape.ts';

/**
 * An n-dimensional array, row-major and always contiguous: views that would alias
 * (transpose, narrow) copy instead, which keeps every kernel simple and every result
 * reproducible. Methods use PyTorch's names; dims may be negative.
 *
 * Its storage belongs to a device (`device`): host memory ('cpu'), the TypedArray `data`
 * that the kernels read, or a device backend's memory (`deviceStorage`), which only that
 * backend's kernels touch. Reading `data` of a tensor on a device is a DeviceDataError: its
 * values come back with `await t.read()` or `await t.toHost()`, never by a silent copy.
 */
export class Tensor {
  /** The values, row-major (host tensors; a DeviceDataError on a device, see `read()`). */
  data: TypedArray;
  readonly shape: readonly number[];
  readonly dtype: DType;
  grad: Tensor | null = null;
  /** The autograd node that produced this tensor; null for leaves. */
  node: GradNode | null = null;
  private _requiresGrad = false;
  /**
   * A frozen weight held in a compact format (bf16, or int8/int4 blocks: quant/formats.ts), its rows the tensor's
   * first dim; then `data` is empty and the ops that take weights (linear, embedding) read this. See packWeight.
   */
  packed: PackedMatrix | null = null;
  /** The memory of a tensor that lives on a device; null for host tensors (their storage is `data`). */
  readonly deviceStorage: DeviceStorage | null = null;

  /** A host tensor over `data`, or a tensor over a device backend's storage. */
  constructor(data: TypedArray | DeviceStorage, shape: Shape) {
    if (data.length !== sizeOf(shape)) {
      throw new ShapeMismatchError(`data of length ${data.length} does not fit shape [${shape}]`);
    }
    this.shape = Object.freeze([...shape]);
    if (ArrayBuffer.isView(data)) {
      // (isView, not `instanceof DeviceStorage`: a typed array's prototype chain is longer to walk, measurably)
      this.data = data as TypedArray;
      this.dtype = dtypeOf(data as TypedArray);
    } else {
      this.dtype = data.dtype;
      this.deviceStorage = data;
      this.data = EMPTY; // replaced by the guard below
      Object.defineProperty(this, 'data', { get: offHost, set: offHost, enumerable: true });
      noteDeviceTensor();
    }
  }

  /** @internal What tells a tensor apart in the ops' arguments (dispatch.ts). */
  get [TENSOR_MARK](): true {
    return true;
  }

  /** Where the storage lives: 'cpu' (host memory, `data`) or a device backend's name. */
  get device(): Device {
    return this.deviceStorage === null ? CPU : this.deviceStorage.device;
  }

  get requiresGrad(): boolean {
    return this._requiresGrad;
  }

  /** Marks a leaf as a parameter-like tensor whose gradient `backward()` accumulates. */
  set requiresGrad(value: boolean) {
    if (value && !isFloat(this.dtype)) throw new DTypeError(`an ${this.dtype} tensor cannot require grad`);
    if (!value && this.node !== null) {
      throw new AutogradError('requiresGrad can only be cleared on a leaf; use detach()');
    }
    this._requiresGrad = value;
  }

  /** @internal Used by autograd to flag outputs of recorded ops. */
  setRequiresGradUnchecked(value: boolean): void {
    this._requiresGrad = value;
  }

  get ndim(): number {
    return this.shape.length;
  }

  get size(): number {
    if (this.packed !== null) return this.packed.rows * this.packed.cols;
    return this.deviceStorage === null ? this.data.length : this.deviceStorage.length;
  }

  get isLeaf(): boolean {
    return this.node === null;
  }

  /** Size of one dim (negative counts from the end). */
  dim(d: number): number {
    const i = d < 0 ? this.ndim + d : d;
    if (i < 0 || i >= this.ndim)
      throw new InvalidArgumentError(`dim ${d} out of range for rank ${this.ndim}`);
    return this.shape[i];
  }

  item(): number {
    if (this.size !== 1) throw new ShapeMismatchError(`item() needs one element, tensor has ${this.size}`);
    activeRecorder()?.checkRead(this, 'item()');
    return this.data[0];
  }

  toArray(): number[] {
    activeRecorder()?.checkRead(this, 'toArray()');
    return Array.from(this.data);
  }

  /**
   * The values, wherever the tensor lives: a host tensor's own `data` (no copy), a device
   * tensor's copied out of the device.
   * @example
   * const logits = await model.forward(ids).read()
   */
  async read(): Promise<TypedArray> {
    const storage = this.deviceStorage;
    if (storage === null) return this.data;
    const out = allocate(storage.dtype, storage.length);
    await storage.backend.allocator.copyout(storage.handle, out);
    return out;
  }

  /**
   * This tensor in host memory: itself when it lives there, else a new host tensor with its
   * values (not in the autograd graph).
   * @example
   * const y = await gpuSection.forward(x.to('webgpu')).toHost()
   */
  async toHost(): Promise<Tensor> {
    if (this.deviceStorage === null) return this;
    return new Tensor(await this.read(), this.shape);
  }

  /**
   * Returns a device tensor's memory to its backend now rather than when it is collected (later
   * use is an error there); nothing on the host.
   * @example
   * const y = await h.toHost(); h.dispose()
   */
  dispose(): void {
    this.deviceStorage?.free();
  }

  /** A new leaf sharing no graph with this one (same data buffer). */
  detach(): Tensor {
    return detach(this);
  }

  /** A copy with its own buffer, recorded in the graph. */
  clone(): Tensor {
    return sh.clone(this);
  }

  /**
   * Converts between dtypes (not differentiable across int32), or moves the tensor to a device:
   * `to('webgpu')` copies a host tensor into the memory of the backend registered as 'webgpu'
   * (a new leaf; itself when already there). The way back is asynchronous: `await t.toHost()`.
   * @example
   * ids.to('float32')
   * const x = tensor(values, [1, 16]).to('webgpu')
   */
  to(target: DType | Device): Tensor {
    if (isDType(target)) return cast(this, target);
    return moveTo(this, target);
  }

  /**
   * @internal Adds `g` into `.grad` (leaves only). With `adopt`, a first gradient takes
   * over g's buffer instead of copying it (autograd passes it when nothing else holds it).
   */
  accumulateGrad(g: Tensor, adopt = false): void {
    if (this.grad === null) {
      this.grad = new Tensor(adopt ? g.data : g.data.slice(), this.shape);
    } else {
      addInto(this.grad.data as FloatArray, g.data);
    }
  }

  /** Accumulates gradients of this tensor into the `.grad` of every leaf that requires one. */
  backward(grad?: Tensor, options: BackwardOptions = {}): void {
    // in a trace, one op: a replay runs backward through the graph its own forward recorded
    if (hooked) hook('backward', backwardOf, [this, grad, options], true);
    else backwardOf(this, grad, options);
  }

  // elementwise
  add(other: Tensor | number): Tensor {
    return ew.add(this, other);
  }

  sub(other: Tensor | number): Tensor {
    return ew.sub(this, other);
  }

  mul(other: Tensor | number): Tensor {
    return ew.mul(this, other);
  }

  div(other: Tensor | number): Tensor {
    return ew.div(this, other);
  }

  pow(exponent: number | Tensor): Tensor {
    return ew.pow(this, exponent);
  }

  neg(): Tensor {
    return ew.neg(this);
  }

  exp(): Tensor {
    return ew.exp(this);
  }

  log(): Tensor {
    return ew.log(this);
  }

  sqrt(): Tensor {
    return ew.sqrt(this);
  }

  rsqrt(): Tensor {
    return ew.rsqrt(this);
  }

  tanh(): Tensor {
    return ew.tanh(this);
  }

  sigmoid(): Tensor {
    return ew.sigmoid(this);
  }

  silu(): Tensor {
    return ew.silu(this);
  }

  gelu(): Tensor {
    return ew.gelu(this);
  }

  relu(): Tensor {
    return ew.relu(this);
  }

  // linear algebra
  matmul(other: Tensor): Tensor {
    return mm.matmul(this, other);
  }

  // reductions
  sum(dim?: number | number[], keepdim = false): Tensor {
    return red.sum(this, dim, keepdim);
  }

  mean(dim?: number | number[], keepdim = false): Tensor {
    return red.mean(this, dim, keepdim);
  }

  max(dim?: number, keepdim = false): Tensor {
    return red.max(this, dim, keepdim);
  }

  argmax(dim = -1, keepdim = false): Tensor {
    return red.argmax(this, dim, keepdim);
  }

  softmax(dim = -1): Tensor {
    return sm.softmax(this, dim);
  }

  logSoftmax(dim = -1): Tensor {
    return sm.logSoftmax(this, dim);
  }

  // shapes
  reshape(shape: Shape): Tensor {
    return sh.reshape(this, shape);
  }

  /** Alias of reshape (tensors are always contiguous). */
  view(shape: Shape): Tensor {
    return sh.reshape(this, shape);
  }

  flatten(startDim = 0, endDim = -1): Tensor {
    return sh.flatten(this, startDim, endDim);
  }

  transpose(dim0: number, dim1: number): Tensor {
    return sh.transpose(this, dim0, dim1);
  }

  permute(dims: number[]): Tensor {
    return sh.permute(this, dims);
  }

  narrow(dim: number, start: number, length: number): Tensor {
    return sh.narrow(this, dim, start, length);
  }

  unsqueeze(dim: number): Tensor {
    return sh.unsqueeze(this, dim);
  }

  squeeze(dim?: number): Tensor {
    return sh.squeeze(this, dim);
  }

  expand(shape: Shape): Tensor {
    return sh.expand(this, shape);
  }

  split(sizeOrSizes: number | number[], dim = 0): Tensor[] {
    return sh.split(this, sizeOrSizes, dim);
  }

  gather(dim: number, index: Tensor): Tensor {
    return sh.gather(this, dim, index);
  }

  indexSelect(dim: number, index: Tensor): Tensor {
    return sh.indexSelect(this, dim, index);
  }

  /** Tensors are always contiguous; kept for PyTorch familiarity. */
  contiguous(): Tensor {
    return this;
  }

  toString(): string {
    if (this.deviceStorage !== null) return `Tensor(${this.dtype}, [${this.shape}], on ${this.device})`;
    const head = Array.from(this.data.subarray(0, 8), (v) => +v.toPrecision(5)).join(', ');
    return `Tensor(${this.dtype}, [${this.shape}], [${head}${this.size > 8 ? ', ...' : ''}])`;
  }
}

const EMPTY = new Float32Array(0);

/** The `data` of a tensor on a device: reading or writing it is an error that says what to call. */
function offHost(this: Tensor): never {
  throw new DeviceDataError(
    `this tensor lives on '${this.device}', not in host memory: read its values with await t.read(), or move it with await t.toHost()`,
    { details: { device: this.device } },
  );
}

/** The dtype conversion of Tensor.to, an op of its own. */
function cast(x: Tensor, dtype: DType): Tensor {
  if (hooked) return hook('cast', cast, [x, dtype]);
  if (dtype === x.dtype) return x;
  const out = allocate(dtype, x.size);
  if (dtype === 'int32') {
    for (let i = 0; i < out.length; i++) out[i] = Math.trunc(x.data[i]);
  } else out.set(x.data);
  return new Tensor(out, x.shape);
}

/** Tensor.detach as an op (a traced step replays it), on any device: it shares the storage. */
function detach(x: Tensor): Tensor {
  if (hooked) return hook('detach', detach, [x], true);
  return new Tensor(x.deviceStorage ?? x.data, x.shape);
}

/** Copies a host tensor into a device backend's memory (see Tensor.to). */
function moveTo(x: Tensor, device: Device): Tensor {
  if (device === x.device) return x;
  activeRecorder()?.checkRead(x, `to('${device}')`);
  if (device === CPU || x.deviceStorage !== null) {
    throw new DeviceDataError(
      `moving a tensor from '${x.device}' to '${device}' reads it back, which is asynchronous: await t.toHost() first`,
      { details: { from: x.device, to: device } },
    );
  }
  if (x.packed !== null) throw new InvalidArgumentError(`a weight held in a compact format cannot move to '${device}' yet`);
  if (!backendNames().includes(device)) {
    throw new InvalidArgumentError(`'${device}' is neither a dtype (float32, float64, int32) nor a registered backend (${backendNames().join(', ')})`);
  }
  const backend = loadBackend(device);
  const allocator = backend.allocator;
  if (allocator === undefined || (backend.device ?? CPU) !== device) {
    throw new InvalidArgumentError(`backend '${device}' computes in host memory; only a device backend's name is a device to move to`);
  }
  const handle = allocator.alloc(x.dtype, x.size);
  allocator.copyin(handle, x.data);
  return new Tensor(new DeviceStorage(backend as Backend & { readonly allocator: Allocator }, handle, x.dtype, x.size), x.shape);
}

/** Tensor.backward's work (an op of its own in a traced step: see trace.ts). */
function backwardOf(t: Tensor, grad: Tensor | undefined, options: BackwardOptions): void {
  if (grad === undefined && t.size !== 1) {
    throw new AutogradError(`backward() without a gradient needs a scalar, got shape [${t.shape}]`);
  }
  const seed = (): Tensor => {
    const one = new Tensor(allocate(t.dtype, 1).fill(1), t.shape);
    return t.deviceStorage === null ? one : one.to(t.device);
  };
  const g = grad ?? seed();
  if (g.size !== t.size) throw new ShapeMismatchError('gradient shape does not match the tensor');
  runBackward(t, g, options);
}
