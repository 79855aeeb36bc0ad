import { BackendUnavailableError } from '../../../errors.ts';
import { loadOrtBinding } from './binding.ts';
import { loadOrtFfi } from './ffi.ts';

/** One input or output of a run: its name in the graph, our buffer (float32, int32 or int64) and its dims. */
export interface Feed {
  name: string;
  data: Float32Array | Int32Array | BigInt64Array;
  dims: readonly number[];
}

/** A loaded graph: reads `inputs` and writes into the buffers of `outputs`. */
export interface OrtSession {
  run(inputs: readonly Feed[], outputs: readonly Feed[]): void;
  /** Frees the session and what onnxruntime holds for it (prepacked weights, its pool); it runs no more after. */
  release(): void;
}

/**
 * A way into onnxruntime: 'ffi' (its C API, in place) or 'binding' (onnxruntime-node's
 * own API, which copies every output once more).
 */
export interface OrtRuntime {
  readonly kind: OrtRuntimeKind;
  readonly version: string;
  session(model: Uint8Array, threads: number, spinning: boolean): OrtSession;
}

export type OrtRuntimeKind = 'ffi' | 'binding';

/**
 * The runtime asked for, or the best one that loads here ('ffi', else 'binding'); throws
 * BackendUnavailableError when onnxruntime cannot be loaded at all.
 */
export function loadOrtRuntime(kind?: OrtRuntimeKind): OrtRuntime {
  if (kind !== 'binding') {
    const ffi = loadOrtFfi();
    if (ffi !== null) return ffi;
    if (kind === 'ffi') throw new BackendUnavailableError('the C API of onnxruntime could not be loaded through koffi on this machine');
  }
  return loadOrtBinding();
}
