import { DeviceMismatchError, DeviceOpUnsupportedError, InvalidArgumentError } from '../errors.ts';
import type { Backend } from './backends/backend.ts';
import type { Tensor } from './tensor.ts';

/**
 * The door every public op goes through (`defineOp`). Nothing happens at it in the common
 * case: one boolean says that no trace is recording and no tensor has ever lived on a device,
 * and the op's own function runs. Otherwise, at the outermost public op only (an op that
 * calls other ops inside is one op): its tensor arguments must share one device, an op on a
 * device runs on that device's backend (Backend.runOp) or is refused, and a recording trace
 * notes the call (trace.ts).
 */

/**
 * The mark every tensor carries (a getter on Tensor.prototype), so that this module imports
 * nothing of the engine: every module can define its ops while the import cycle between the
 * tensor and its ops is still being evaluated.
 */
export const TENSOR_MARK: unique symbol = Symbol('tensorlink.tensor');

/** True for a Tensor. */
export function isTensor(value: unknown): value is Tensor {
  return typeof value === 'object' && value !== null && (value as { [TENSOR_MARK]?: boolean })[TENSOR_MARK] === true;
}

/** What a recording trace is told about each outermost op call (trace.ts implements it). */
export interface OpRecorder {
  record(op: string, run: (...args: unknown[]) => unknown, args: readonly unknown[], out: unknown): void;
  /** Refuses a host read of a value the trace computes (a replay could not repeat what follows from it). */
  checkRead(t: Tensor, what: string): void;
  /** Refuses something a trace cannot record (backward()). */
  refuse(what: string): never;
}

/** True when some op call needs the slow path: a trace records, or device tensors exist. */
let hooked = false;
let recorder: OpRecorder | null = null;
let devicesInUse = false;
/** How many public ops are running (the outermost one is at depth 1). */
let depth = 0;

/** @internal The recorder of the trace in progress, if any (trace.ts). */
export function activeRecorder(): OpRecorder | null {
  return recorder;
}

/** @internal Starts or stops recording (trace.ts); returns the previous recorder. */
export function setRecorder(next: OpRecorder | null): OpRecorder | null {
  const previous = recorder;
  recorder = next;
  hooked = recorder !== null || devicesInUse;
  return previous;
}

/** @internal Called when a tensor first lands on a device: ops check devices from then on. */
export function noteDeviceTensor(): void {
  devicesInUse = true;
  hooked = true;
}

/**
 * Makes `fn` a public op named `name`: what a trace records and a device backend runs. With
 * `anyDevice`, the function itself handles tensors on any device (it reads no values: detach).
 * @example
 * export const relu = defineOp('relu', (x: Tensor) => unary('relu', x))
 */
export function defineOp<F extends (...args: never[]) => unknown>(name: string, fn: F, options: { anyDevice?: boolean } = {}): F {
  if (fn.length > 8) throw new InvalidArgumentError(`op '${name}' takes more than the 8 arguments an op passes on`);
  const run = fn as unknown as (...args: unknown[]) => unknown;
  const anyDevice = options.anyDevice ?? false;
  const op = function (a?: unknown, b?: unknown, c?: unknown, d?: unknown, e?: unknown, f?: unknown, g?: unknown, h?: unknown): unknown {
    if (hooked) return hookedCall(name, run, op, anyDevice, [a, b, c, d, e, f, g, h]);
    return run(a, b, c, d, e, f, g, h);
  };
  return op as unknown as F;
}

function hookedCall(
  name: string,
  run: (...args: unknown[]) => unknown,
  op: (...args: unknown[]) => unknown,
  anyDevice: boolean,
  given: unknown[],
): unknown {
  if (depth > 0) return run(...given);
  let n = given.length;
  while (n > 0 && given[n - 1] === undefined) n--;
  const args = given.slice(0, n);
  const owner = devicesInUse ? deviceOwner(name, args) : null;
  depth++;
  try {
    let out: unknown;
    if (owner === null || anyDevice) out = run(...args);
    else {
      out = owner.runOp?.(name, args);
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
  }
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
