import { AutogradError, DTypeError, InvalidArgumentError, ShapeMismatchError } from '../errors.ts';
import { type BackwardOptions, type GradNode, runBackward } from './autograd.ts';
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
 */
export class Tensor {
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

  constructor(data: TypedArray, shape: Shape) {
    if (data.length !== sizeOf(shape)) {
      throw new ShapeMismatchError(`data of length ${data.length} does not fit shape [${shape}]`);
    }
    this.data = data;
    this.shape = Object.freeze([...shape]);
    this.dtype = dtypeOf(data);
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
    return this.packed === null ? this.data.length : this.packed.rows * this.packed.cols;
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
    return this.data[0];
  }

  toArray(): number[] {
    return Array.from(this.data);
  }

  /** A new leaf sharing no graph with this one (same data buffer). */
  detach(): Tensor {
    return new Tensor(this.data, this.shape);
  }

  /** A copy with its own buffer, recorded in the graph. */
  clone(): Tensor {
    return sh.clone(this);
  }

  /** Converts between dtypes (not differentiable across int32). */
  to(dtype: DType): Tensor {
    if (dtype === this.dtype) return this;
    const out = allocate(dtype, this.size);
    if (dtype === 'int32') {
      for (let i = 0; i < out.length; i++) out[i] = Math.trunc(this.data[i]);
    } else out.set(this.data);
    return new Tensor(out, this.shape);
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
    if (grad === undefined && this.size !== 1) {
      throw new AutogradError(`backward() without a gradient needs a scalar, got shape [${this.shape}]`);
    }
    const g = grad ?? new Tensor(allocate(this.dtype, 1).fill(1), this.shape);
    if (g.size !== this.size) throw new ShapeMismatchError('gradient shape does not match the tensor');
    runBackward(this, g, options);
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
    const head = Array.from(this.data.subarray(0, 8), (v) => +v.toPrecision(5)).join(', ');
    return `Tensor(${this.dtype}, [${this.shape}], [${head}${this.size > 8 ? ', ...' : ''}])`;
  }
}
