import { DeviceMismatchError, DeviceOpUnsupportedError } from '../errors.ts';
import type { Backend } from './backends/backend.ts';
import type { Tensor } from './tensor.ts';

/**
 * The door every public op goes through. Each op's first line is
 * `if (hooked) return hook('matmul', matmul, [a, b]);`: nothing happens at it in the common
 * case (one boolean: no trace is recording and no tensor has ever lived on a device), and
 * the op's own code runs. Otherwise `hook` handles the outermost public op only (an op that
 * calls other ops inside is one op: while it runs, `hooked` is off): its tensor arguments
 * must share one device, an op on a device runs on that device's backend (Backend.runOp) or
 * is refused, and a recording trace notes the call (trace.ts).
 *
 * This module imports nothing of the engine (tensors are told apart by TENSOR_MARK), so it
 * is evaluated before the import cycle between the tensor and its ops.
 */

/** The mark every tensor carries (a getter on Tensor.prototype), for `isTensor`. */
export const TENSOR_MARK: unique symbol = Symbol('tensorlink.tensor');

/** True for a Tensor. */
export function isTensor(value: unknown): value is Tensor {
  return typeof value === 'object' && value !== null && (value as { [TENSOR_MARK]?: boolean })[TENSOR_MARK] === true;
}

/** What a recording trace is told about each outermost op call (trace.ts implements it). */
export interface OpRecorder {
  record(op: string, run: (...args: never[]) => unknown, args: readonly unknown[], out: unknown): void;
  /** Refuses a host read of a value the trace computes (a replay could not repeat what follows from it). */
  checkRead(t: Tensor, what: string): void;
}

/**
 * True when the next public op call takes the slow path (`hook`): a trace records, or device
 * tensors exist, and no public op is running already.
 */
export let hooked = false;
let recorder: OpRecorder | null = null;
let devicesInUse = false;
/** How many public ops are running on the slow path (the outermost one is at depth 1). */
let depth = 0;

function rearm(): void {
  hooked = depth === 0 && (recorder !== null || devicesInUse);
}

/** @internal The recorder of the trace in progress, if any, outside the public ops (trace.ts, Tensor.item). */
export function activeRecorder(): OpRecorder | null {
  return depth === 0 ? recorder : null;
}

/**
 * True while a trace is recording (trace.ts), inside public ops too: model code that does work
 * on the host between ops (a KV cache grown in place, fused decoding on plain buffers) steps
 * aside for the ops path then, so that a replay recomputes it. One read; false outside a trace.
 * @example
 * if (isTracing()) return cat([past, k], 2) // recorded; the in-place append is not
 */
export function isTracing(): boolean {
  return recorder !== null;
}

/** @internal Starts or stops recording (trace.ts); returns the previous recorder. */
export function setRecorder(next: OpRecorder | null): OpRecorder | null {
  const previous = recorder;
  recorder = next;
  rearm();
  return previous;
}

/** @internal Called when a tensor first lands on a device: ops check devices from then on. */
export function noteDeviceTensor(): void {
  devicesInUse = true;
  rearm();
}

/**
 * The slow path of the public op `op` named `name`, called with `given` (its parameters in
 * order; trailing undefined ones are dropped). With `anyDevice`, the op's own code handles
 * tensors on any device (it reads no values: detach).
 */
export function hook<R>(name: string, op: (...args: never[]) => R, given: unknown[], anyDevice = false): R {
  let n = given.length;
  while (n > 0 && given[n - 1] === undefined) n--;
  const args = given.slice(0, n);
  const owner = devicesInUse ? deviceOwner(name, args) : null;
  const run = op as unknown as (...args: unknown[]) => R;
  depth++;
  hooked = false;
  try {
    let out: R | undefined;
    if (owner === null || anyDevice) out = run(...args);
    else {
      out = owner.runOp?.(name, args) as R | undefined;
      if (out === undefined) {
        throw new DeviceOpUnsupportedError(
          `'${name}' has no kernel on device '${owner.device}' (backend '${owner.name}'); read its inputs back with await t.toHost() to run it on the host`,
          { details: { op: name, device: owner.device } },
        );
      }
    }
    recorder?.record(name, op, args, out);
    return out;
  } finally {
    depth--;
    rearm();
  }
}

/**
 * A public op defined outside tensor/ (a composite of other ops with host code between them,
 * such as a mixture of experts' routing): `fn` behind the door, as the engine's ops are. A
 * trace records one call of it as one op (its tensor arguments slots, the rest attributes:
 * class instances by reference, so a module's weights are read at each replay) and a replay
 * calls `fn` again, host code included; outside a trace and without device tensors it calls
 * `fn` straight away (one boolean read before it), the same arithmetic. On a device it is refused (no backend has a kernel for it).
 * @example
 * // values sorted on the host: a replay sorts its new input
 * const sorted = compositeOp('sorted', (x: Tensor): Tensor => tensor(Float32Array.from(x.data).sort(), x.shape))
 * const { step } = trace((x) => sorted(x).mul(2), [x0])
 * step.run([x1]) // sorted(x1).mul(2)
 */
export function compositeOp<A extends unknown[], R>(name: string, fn: (...args: A) => R): (...args: A) => R {
  const run = fn as unknown as (...args: unknown[]) => R;
  const op = (...args: unknown[]): R => (hooked ? hook(name, op, args) : run(...args));
  Object.defineProperty(op, 'name', { value: name });
  return op as (...args: A) => R;
}

/** Calls `visit` on every tensor in an op's arguments: tensors, arrays and plain objects of them. */
export function forEachTensor(value: unknown, visit: (t: Tensor) => void): void {
  if (isTensor(value)) visit(value);
  else if (Array.isArray(value)) for (const v of value) forEachTensor(v, visit);
  else if (isPlainObject(value)) for (const v of Object.values(value)) forEachTensor(v, visit);
}

export function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null) return false;
  const proto = Object.getPrototypeOf(value) as unknown;
  return proto === Object.prototype || proto === null;
}

/** The backend that owns the arguments' device, null for host tensors; mixed devices are an error. */
function deviceOwner(name: string, args: readonly unknown[]): Backend | null {
  const tensors: Tensor[] = [];
  forEachTensor(args, (t) => tensors.push(t));
  if (tensors.length === 0) return null;
  const device = tensors[0].device;
  for (const t of tensors) {
    if (t.device !== device) {
      throw new DeviceMismatchError(
        `'${name}' got tensors on '${device}' and on '${t.device}': move one with t.to('${device}') (or await t.toHost())`,
        { details: { op: name, devices: [device, t.device] } },
      );
    }
  }
  return tensors[0].deviceStorage?.backend ?? null;
}
