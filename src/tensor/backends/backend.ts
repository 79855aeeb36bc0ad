import type { Allocator, Device } from '../device.ts';
import type { FloatArray } from '../dtype.ts';
import type { MatmulSpec } from '../kernels/matmul.ts';
import type { TimeMajorAttentionSpec } from '../ops/attention.ts';
import type { PackedMatrix, WeightFormat } from '../quant/formats.ts';
import type { Tensor } from '../tensor.ts';
import type { CompiledStep, TracedStep } from '../trace.ts';

/** A weight [rows, cols] of a fused product (y = x · Wᵀ): float32 `values`, or a compact matrix. */
export interface LinearWeight {
  rows: number;
  cols: number;
  values: Float32Array | null;
  packed: PackedMatrix | null;
}

/** What a tolerance is stated per: the format of the weights a result was computed with (float32: 'f32'). */
export type ToleranceFormat = 'f32' | WeightFormat;

/**
 * How far a backend's results may lie from the js kernels', per format of the weights: the
 * largest relative L2 distance ‖x − ref‖₂ / ‖ref‖₂ (verify/compare.ts's `drift`, the measure
 * results are compared by; for int8 and int4, of what a section adds to its input). The
 * conformance suite (test/tensor/backends/) holds every backend to the tolerance it states.
 * All zeros (EXACT): bit for bit.
 */
export type Tolerance = Readonly<Record<ToleranceFormat, number>>;

/** Bit for bit: the tolerance of a deterministic backend that computes js's sums. */
export const EXACT: Tolerance = Object.freeze({ f32: 0, bf16: 0, int8: 0, int4: 0 });

/**
 * A compute backend (after tinygrad's device: a place where buffers live plus a way to run
 * work there). A host backend (`device` 'cpu': js, ort) offers the kernels worth handing to
 * something faster than plain TypeScript; everything else runs on the js kernels, and the
 * host ops pick it up from the CPU context (`setBackend`/`withBackend`). A device backend
 * (`device` its own name, e.g. 'webgpu') owns memory through its `allocator`, runs the ops
 * of tensors that live there (`runOp`), and may take a whole traced step (`compileStep`).
 * Backends are registered by name: backends/registry.ts.
 */
export interface Backend {
  readonly name: string;
  /** True when results are bitwise identical on every machine. */
  readonly deterministic: boolean;
  /** Where the tensors it computes on live; 'cpu' (host memory) when absent. */
  readonly device?: Device;
  /** How close to the js kernels its results are (see Tolerance); EXACT when absent and deterministic. */
  readonly tolerance?: Tolerance;
  /** A device backend's memory: how tensors move to and from it (`t.to(device)`, `t.toHost()`). */
  readonly allocator?: Allocator;
  /**
   * Runs the public op `op` (its name in the trace, e.g. 'matmul') on tensors that live on this
   * backend's device: `args` are the op's arguments as the caller gave them (tensors, numbers,
   * option objects), every tensor among them on this device. Returns what the op returns (its
   * tensors on this device), or undefined when the backend has no kernel for it, which the
   * engine reports as a DeviceOpUnsupportedError naming the op and device: it never copies to
   * the host on its own. Kernels call other kernels directly, not the public ops.
   */
  runOp?(op: string, args: readonly unknown[]): unknown;
  /**
   * Host tensors whose values changed outside this backend's steps (an optimizer's step on the host): a backend that
   * keeps a copy of them (webgpu: the parameters its compiled steps read) drops it, so that its next step reads them
   * again.
   */
  forget?(tensors: readonly Tensor[]): void;
  /**
   * Takes a whole traced step (see trace.ts) to run as one program (an ONNX graph, a chain of
   * GPU dispatches) instead of op by op. Called once per step and backend, when the step first
   * runs with inputs on this backend's device (or, for a host backend, while it is the CPU
   * context); returns null to decline, and the step then replays op by op. The compiled step
   * receives the step's inputs in order (the shapes and dtypes traced) and returns the
   * tensors of `step.outputSlots`, in that order, on its device. Constants (`step.slots` of
   * kind 'constant': parameters) are read by reference at each run, so an optimizer's update
   * between runs is seen; a compiled step that uploads them once must say so.
   */
  compileStep?(step: TracedStep): CompiledStep | null;
  /** out = op(a) op(b) per batch, plus `bias` (length n) on every row when given. */
  matmul(a: FloatArray, b: FloatArray, out: FloatArray, spec: MatmulSpec, bias?: FloatArray): void;
  /**
   * y [m, w.rows] = x [m, w.cols] · Wᵀ for a weight held in a compact format; returns false to leave it to the js
   * kernel (exact: see quant/kernels.ts).
   */
  packedLinear?(x: Float32Array, m: number, w: PackedMatrix, y: Float32Array): boolean;
  /**
   * Lets go of what the backend holds for these compact weights (onnxruntime's sessions, each with its prepacked copy):
   * a section whose weights go calls it, so that their copies go too. A weight used again after builds anew.
   */
  releasePacked?(weights: Iterable<PackedMatrix>): void;
  /** Sessions the backend holds for compact weights now (what releasePacked frees). */
  packedSessions?(): number;
  /**
   * Bytes the backend keeps now beside these compact weights (onnxruntime: the prepacked copy in each session made for
   * one, per pool size and per fused group): what a worker counts in its budget besides the weights themselves.
   */
  prepackedBytes?(weights: Iterable<PackedMatrix>): number;
  /** y = op(x) for a unary op by name; returns false to leave it to the js kernel. */
  unary?(op: string, x: FloatArray, y: FloatArray): boolean;
  /** gx = g · op'(x); returns false to leave it to the js kernel. */
  unaryBackward?(op: string, x: FloatArray, g: FloatArray, gx: FloatArray): boolean;
  /**
   * y = softmax(scale · x) over rows of `tk` in `blocks` of `tq` rows, row i of a block seeing
   * keys 0 … i + tk − tq when `causal` (else all); returns false to leave it to the js kernel.
   */
  softmax?(x: FloatArray, y: FloatArray, blocks: number, tq: number, tk: number, scale: number, causal: boolean): boolean;
  /**
   * Layer norm over rows of n: y, each row's mean and 1/σ (w and b of length n); returns
   * false to leave it to the js kernel.
   */
  layerNorm?(x: FloatArray, w: FloatArray, b: FloatArray, eps: number, y: FloatArray, mean: Float32Array, rstd: Float32Array): boolean;
  /**
   * Causal attention of one sequence: y [H, Tq, D] for q [H, Tq, D] over time-major keys and values [Tk, kvHeads, D]
   * (see attendTimeMajor); returns false to leave it to the js kernel.
   */
  attention?(q: Float32Array, k: Float32Array, v: Float32Array, y: Float32Array, spec: TimeMajorAttentionSpec): boolean;
  /**
   * ys[i] [m, ws[i].rows] = x [m, cols] · ws[i]ᵀ for weights that share their input (a block's q, k, v) in one call;
   * returns false to leave them to `linear`.
   */
  linears?(x: Float32Array, m: number, ws: readonly LinearWeight[], ys: readonly Float32Array[]): boolean;
  /** y [m, down.rows] = (silu(x · gateᵀ) ⊙ (x · upᵀ)) · downᵀ in one call; returns false to leave it to the ops. */
  gatedMlp?(x: Float32Array, m: number, gate: LinearWeight, up: LinearWeight, down: LinearWeight, y: Float32Array): boolean;
}
