import { createRequire } from 'node:module';
import { BackendUnavailableError } from '../../../errors.ts';
import type { Feed, OrtRuntime } from './runtime.ts';
import { disableOrtTelemetry } from './telemetry.ts';

/**
 * onnxruntime-node's native binding, called synchronously (its public
 * `InferenceSession.run` only wraps the same call in a promise). It copies each output
 * from onnxruntime's own memory into ours after the run.
 */

interface NativeSession {
  loadModel(buffer: ArrayBuffer, offset: number, length: number, options: object): void;
  run(feeds: Record<string, unknown>, fetches: Record<string, unknown>, options: object): unknown;
  /** Frees the native session (onnxruntime-node 1.16 and later). */
  dispose?(): void;
}

let loaded: OrtRuntime | undefined;

export function loadOrtBinding(): OrtRuntime {
  if (loaded !== undefined) return loaded;
  try {
    const require = createRequire(import.meta.url);
    const { binding, initOrt } = require('onnxruntime-node/dist/binding.js');
    const { Tensor } = require('onnxruntime-common');
    const { version } = require('onnxruntime-node/package.json') as { version: string };
    disableOrtTelemetry();
    initOrt();
    const tensors = (feeds: readonly Feed[]) =>
      Object.fromEntries(feeds.map((f) => [f.name, new Tensor(f.data instanceof Float32Array ? 'float32' : f.data instanceof Int32Array ? 'int32' : 'int64', f.data, f.dims)]));
    loaded = {
      kind: 'binding',
      version,
      session(model, threads, spinning) {
        const s = new binding.InferenceSession() as NativeSession;
        s.loadModel(model.buffer as ArrayBuffer, model.byteOffset, model.byteLength, {
          intraOpNumThreads: threads,
          interOpNumThreads: 1,
          executionMode: 'sequential',
          graphOptimizationLevel: 'all',
          extra: { session: { intra_op: { allow_spinning: spinning ? '1' : '0' } } },
        });
        return { run: (inputs, outputs) => void s.run(tensors(inputs), tensors(outputs), {}), release: () => s.dispose?.() };
      },
    };
    return loaded;
  } catch (cause) {
    throw new BackendUnavailableError('onnxruntime-node could not be loaded on this machine; use the js backend', { cause });
  }
}
