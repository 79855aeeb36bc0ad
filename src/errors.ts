/**
 * Typed errors shared by every layer. One base class with a short message, optional
 * details for machines and an optional cause; one small subclass per condition.
 * Callers (and tests) branch on `err.name`, never on the wording.
 */
export class TensorLinkError extends Error {
  readonly details: Record<string, unknown>;

  constructor(message: string, options: { details?: Record<string, unknown>; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'TensorLinkError';
    this.details = options.details ?? {};
  }
}

function errorClass(name: string) {
  return class extends TensorLinkError {
    constructor(message: string, options: { details?: Record<string, unknown>; cause?: unknown } = {}) {
      super(message, options);
      this.name = name;
    }
  };
}

/** Shapes that cannot be combined (broadcast, matmul, reshape, concat, state dict). */
export class ShapeMismatchError extends errorClass('ShapeMismatchError') {}
/** A dtype an operation does not accept, or two operands of different dtypes. */
export class DTypeError extends errorClass('DTypeError') {}
/** An argument out of range or of the wrong kind (a bad dim, a negative size, ...). */
export class InvalidArgumentError extends errorClass('InvalidArgumentError') {}
/** A backward pass that cannot run (no graph, graph already freed, non-scalar root). */
export class AutogradError extends errorClass('AutogradError') {}
/** A compute backend that cannot be loaded on this machine. */
export class BackendUnavailableError extends errorClass('BackendUnavailableError') {}
/** Tensors on different devices given to one op (move one with `t.to(device)`). */
export class DeviceMismatchError extends errorClass('DeviceMismatchError') {}
/** A host read (`.data`, `item()`) of a tensor that lives on a device (read it with `await t.read()`). */
export class DeviceDataError extends errorClass('DeviceDataError') {}
/** An op that has no kernel on the device its inputs live on. */
export class DeviceOpUnsupportedError extends errorClass('DeviceOpUnsupportedError') {}
/** A traced step that cannot record or replay what its function did (see tensor/trace.ts). */
export class TraceError extends errorClass('TraceError') {}
/** A file that is missing or unreadable. */
export class FileNotFoundError extends errorClass('FileNotFoundError') {}
/** A safetensors file or index that does not follow the format. */
export class SafetensorsFormatError extends errorClass('SafetensorsFormatError') {}
/** A GGUF file that does not follow the format, or holds what the reader does not support (named in the message). */
export class GGUFFormatError extends errorClass('GGUFFormatError') {}
/** A state dict whose keys or shapes do not match a module. */
export class StateDictError extends errorClass('StateDictError') {}
/** A message from a peer that is malformed, oversized, unknown or not allowed. */
export class InvalidMessageError extends errorClass('InvalidMessageError') {}
/** A peer that cannot be reached (dial failed, stream reset, timeout). */
export class PeerUnreachableError extends errorClass('PeerUnreachableError') {}
/** A peer sent more messages than its rate allows; it is answered with this and not served. */
export class RateLimitedError extends errorClass('RateLimitedError') {}
/** A peer asked for something only another peer may do (e.g. drive a job it does not own). */
export class UnauthorizedError extends errorClass('UnauthorizedError') {}
/** No placement of a model fits the devices offered; the message says which layer and how much is short. */
export class PlanInfeasibleError extends errorClass('PlanInfeasibleError') {}
/** A pipeline stage (a worker, or the user's own end) that failed during a training step; details.stage names it. */
export class StageFailedError extends errorClass('StageFailedError') {}
/** Something awaited (the gradients of a replica, a step of the pipeline) that did not come before its deadline. */
export class TimeoutError extends errorClass('TimeoutError') {}
/** A worker asked to hold more than its `--memory` allows (weights, training state, activations, KV caches): it refuses, keeps serving. */
export class MemoryBudgetError extends errorClass('MemoryBudgetError') {}
/** A worker's record or result failed a check: a bad signature, a broken chain, outputs that disagree, a failed re-execution. */
export class VerificationError extends errorClass('VerificationError') {}
/** The Ethereum node could not be reached, or refused a transaction. */
export class ChainError extends errorClass('ChainError') {}
