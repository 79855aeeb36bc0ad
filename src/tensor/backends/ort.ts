import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { BackendUnavailableError } from '../../errors.ts';
import type { FloatArray } from '../dtype.ts';
import { addRowBias, type MatmulSpec, matmulJs } from '../kernels/matmul.ts';
import type { Backend } from './backend.ts';
import {
  batchedMatmulGraph,
  gemmGraph,
  ORT_UNARY,
  ORT_UNARY_BACKWARD,
  type OrtUnary,
  type OrtUnaryBackward,
  unaryBackwardGraph,
  unaryGraph,
} from './ort-graphs.ts';

/**
 * Matrix products through onnxruntime-node's CPU kernels (MLAS), called
 * synchronously through its native binding so that the engine stays eager: the
 * public `InferenceSession.run` only wraps the same native call in a promise.
 * Outputs are written straight into our buffers (pre-bound fetches).
 */

/** Below this many multiply-adds the native call costs more than the js kernel (measured: bench/run.ts). */
export const ORT_MIN_MACS = 32 * 1024;
/** Below this many elements a transcendental op is cheaper in js than a native call (~15 µs). */
export const ORT_MIN_ELEMENTS = 4096;

interface NativeSession {
  loadModel(buffer: ArrayBuffer, offset: number, length: number, options: object): void;
  run(feeds: Record<string, unknown>, fetches: Record<string, unknown>, options: object): unknown;
}

interface OrtModules {
  newSession(): NativeSession;
  TensorClass: new (type: string, data: FloatArray, dims: readonly number[]) => unknown;
}

let modules: OrtModules | null = null;

function loadOrt(): OrtModules {
  if (modules !== null) return modules;
  try {
    const require = createRequire(import.meta.url);
    const { binding, initOrt } = require('onnxruntime-node/dist/binding.js');
    const { Tensor } = require('onnxruntime-common');
    initOrt();
    modules = { newSession: () => new binding.InferenceSession() as NativeSession, TensorClass: Tensor };
    return modules;
  } catch (cause) {
    throw new BackendUnavailableError(
      'onnxruntime-node could not be loaded on this machine; use the js backend',
      {
        cause,
      },
    );
  }
}

/** True when onnxruntime-node's native library loads here. */
export function ortAvailable(): boolean {
  try {
    loadOrt();
    return true;
  } catch {
    return false;
  }
}

export interface OrtBackendOptions {
  /** Intra-op threads (default: all available cores). */
  threads?: number;
  /** Products with fewer multiply-adds run on the js kernel. */
  minMacs?: number;
  /** Elementwise ops on fewer elements run on the js kernel. */
  minElements?: number;
  /**
   * Whether idle pool threads spin-wait (onnxruntime's default) instead of sleeping. A
   * spinning thread takes a core from the js kernels that run between native calls
   * (a training step, 2 threads: ~690 ms quiet, ~1100 ms spinning), but waking a sleeping
   * one costs tens of µs, which dominates a small product (1×768×3072, 2 threads: 0.67× raw
   * onnxruntime quiet, 1.05× spinning). 'auto' (default) spins only for products below
   * SPIN_BELOW_MACS, the latency-bound decoding regime.
   */
  spinning?: boolean | 'auto';
}

/** Products below this many multiply-adds use a spinning pool under `spinning: 'auto'`. */
export const SPIN_BELOW_MACS = 16 * 1024 * 1024;
/**
 * Work below these sizes runs on the calling thread alone (a 1-thread session): splitting
 * it across a pool costs more than it saves, and every session's pool is a set of threads
 * competing for the same cores.
 */
export const SINGLE_THREAD_BELOW_MACS = 1024 * 1024;
export const SINGLE_THREAD_BELOW_ELEMENTS = 256 * 1024;

/** Creates an ort backend; throws BackendUnavailableError where onnxruntime cannot load. */
export function createOrtBackend(options: OrtBackendOptions = {}): Backend & { threads: number } {
  const ort = loadOrt();
  const threads = options.threads ?? availableParallelism();
  const minMacs = options.minMacs ?? ORT_MIN_MACS;
  const minElements = options.minElements ?? ORT_MIN_ELEMENTS;
  const spinning = options.spinning ?? 'auto';
  const sessions = new Map<string, NativeSession>();
  const sessionOptions = (spin: boolean, poolThreads: number) => ({
    intraOpNumThreads: poolThreads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
    // See `spinning` above.
    extra: { session: { intra_op: { allow_spinning: spin ? '1' : '0' } } },
  });

  function session(key: string, build: () => Uint8Array, spin = spinning === true, poolThreads = threads): NativeSession {
    const fullKey = `${key}:${spin}:${poolThreads}`;
    let s = sessions.get(fullKey);
    if (s === undefined) {
      const bytes = build();
      s = ort.newSession();
      s.loadModel(bytes.buffer as ArrayBuffer, bytes.byteOffset, bytes.byteLength, sessionOptions(spin, poolThreads));
      sessions.set(fullKey, s);
    }
    return s;
  }

  const T = ort.TensorClass;
  return {
    name: 'ort',
    deterministic: false,
    threads,
    matmul(a: FloatArray, b: FloatArray, out: FloatArray, spec: MatmulSpec, bias?: FloatArray): void {
      const { batch, m, k, n, transA, transB } = spec;
      if (!(a instanceof Float32Array) || batch * m * k * n < minMacs) {
        matmulJs(a, b, out, spec);
        if (bias) addRowBias(out, bias);
        return;
      }
      const macs = batch * m * k * n;
      const poolThreads = macs < SINGLE_THREAD_BELOW_MACS ? 1 : threads;
      const spin = spinning === 'auto' ? poolThreads > 1 && macs < SPIN_BELOW_MACS : spinning;
      const aDims = transA ? [k, m] : [m, k];
      const bDims = transB ? [n, k] : [k, n];
      if (batch === 1 || (!spec.batchedA && !spec.batchedB)) {
        const withBias = bias instanceof Float32Array;
        const s = session(`gemm:${transA}:${transB}:${withBias}`, () => gemmGraph(transA, transB, withBias), spin, poolThreads);
        const rows = m * n;
        for (let p = 0; p < batch; p++) {
          const av = spec.batchedA ? a.subarray(p * m * k, (p + 1) * m * k) : a;
          const bv = spec.batchedB ? b.subarray(p * k * n, (p + 1) * k * n) : b;
          const cv = out.subarray(p * rows, (p + 1) * rows);
          const feeds: Record<string, unknown> = { a: new T('float32', av, aDims), b: new T('float32', bv, bDims) };
          if (withBias) feeds.bias = new T('float32', bias, [n]);
          s.run(feeds, { c: new T('float32', cv, [m, n]) }, {});
        }
        if (bias && !withBias) addRowBias(out, bias);
        return;
      }
      const s = session(`batched:${transA}:${transB}`, () => batchedMatmulGraph(transA, transB), spin, poolThreads);
      s.run(
        {
          a: new T('float32', a, [spec.batchedA ? batch : 1, ...aDims]),
          b: new T('float32', b, [spec.batchedB ? batch : 1, ...bDims]),
        },
        { c: new T('float32', out, [batch, m, n]) },
        {},
      );
      if (bias) addRowBias(out, bias);
    },
    unary(op: string, x: FloatArray, y: FloatArray): boolean {
      if (!(x instanceof Float32Array) || x.length < minElements || !ORT_UNARY.has(op)) return false;
      const s = session(`unary:${op}`, () => unaryGraph(op as OrtUnary), false, x.length < SINGLE_THREAD_BELOW_ELEMENTS ? 1 : threads);
      s.run({ x: new T('float32', x, [x.length]) }, { y: new T('float32', y, [y.length]) }, {});
      return true;
    },
    unaryBackward(op: string, x: FloatArray, g: FloatArray, gx: FloatArray): boolean {
      if (!(x instanceof Float32Array) || x.length < minElements || !ORT_UNARY_BACKWARD.has(op)) return false;
      const s = session(
        `unary-backward:${op}`,
        () => unaryBackwardGraph(op as OrtUnaryBackward),
        false,
        x.length < SINGLE_THREAD_BELOW_ELEMENTS ? 1 : threads,
      );
      s.run(
        { x: new T('float32', x, [x.length]), g: new T('float32', g, [g.length]) },
        { gx: new T('float32', gx, [gx.length]) },
        {},
      );
      return true;
    },
  };
}
