import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { BackendUnavailableError } from '../../errors.ts';
import type { FloatArray } from '../dtype.ts';
import { type MatmulSpec, matmulJs } from '../kernels/matmul.ts';
import type { Backend } from './backend.ts';
import { encodeModel, type NodeSpec, OnnxType, type ValueInfo } from './onnx-graph.ts';

/**
 * Matrix products through onnxruntime-node's CPU kernels (MLAS), called
 * synchronously through its native binding so that the engine stays eager: the
 * public `InferenceSession.run` only wraps the same native call in a promise.
 * Outputs are written straight into our buffers (pre-bound fetches).
 */

/** Below this many multiply-adds the native call costs more than the js kernel (measured: bench/run.ts). */
export const ORT_MIN_MACS = 32 * 1024;

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

function gemmGraph(transA: boolean, transB: boolean): Uint8Array {
  const inputs: ValueInfo[] = [
    { name: 'a', type: OnnxType.float32, shape: ['r0', 'c0'] },
    { name: 'b', type: OnnxType.float32, shape: ['r1', 'c1'] },
  ];
  const node: NodeSpec = {
    op: 'Gemm',
    inputs: ['a', 'b'],
    outputs: ['c'],
    attributes: { transA: transA ? 1 : 0, transB: transB ? 1 : 0 },
  };
  return encodeModel([node], inputs, [{ name: 'c', type: OnnxType.float32, shape: ['m', 'n'] }]);
}

function batchedGraph(transA: boolean, transB: boolean): Uint8Array {
  const nodes: NodeSpec[] = [];
  let a = 'a';
  let b = 'b';
  if (transA) {
    nodes.push({ op: 'Transpose', inputs: ['a'], outputs: ['at'], attributes: { perm: [0, 2, 1] } });
    a = 'at';
  }
  if (transB) {
    nodes.push({ op: 'Transpose', inputs: ['b'], outputs: ['bt'], attributes: { perm: [0, 2, 1] } });
    b = 'bt';
  }
  nodes.push({ op: 'MatMul', inputs: [a, b], outputs: ['c'] });
  const inputs: ValueInfo[] = [
    { name: 'a', type: OnnxType.float32, shape: ['ba', 'r0', 'c0'] },
    { name: 'b', type: OnnxType.float32, shape: ['bb', 'r1', 'c1'] },
  ];
  return encodeModel(nodes, inputs, [{ name: 'c', type: OnnxType.float32, shape: ['bc', 'm', 'n'] }]);
}

export interface OrtBackendOptions {
  /** Intra-op threads (default: all available cores). */
  threads?: number;
  /** Products with fewer multiply-adds run on the js kernel. */
  minMacs?: number;
}

/** Creates an ort backend; throws BackendUnavailableError where onnxruntime cannot load. */
export function createOrtBackend(options: OrtBackendOptions = {}): Backend & { threads: number } {
  const ort = loadOrt();
  const threads = options.threads ?? availableParallelism();
  const minMacs = options.minMacs ?? ORT_MIN_MACS;
  const sessions = new Map<string, NativeSession>();
  const sessionOptions = {
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  };

  function session(key: string, build: () => Uint8Array): NativeSession {
    let s = sessions.get(key);
    if (s === undefined) {
      const bytes = build();
      s = ort.newSession();
      s.loadModel(bytes.buffer as ArrayBuffer, bytes.byteOffset, bytes.byteLength, sessionOptions);
      sessions.set(key, s);
    }
    return s;
  }

  const T = ort.TensorClass;
  return {
    name: 'ort',
    deterministic: false,
    threads,
    matmul(a: FloatArray, b: FloatArray, out: FloatArray, spec: MatmulSpec): void {
      const { batch, m, k, n, transA, transB } = spec;
      if (!(a instanceof Float32Array) || batch * m * k * n < minMacs) {
        matmulJs(a, b, out, spec);
        return;
      }
      const aDims = transA ? [k, m] : [m, k];
      const bDims = transB ? [n, k] : [k, n];
      if (batch === 1 || (!spec.batchedA && !spec.batchedB)) {
        const s = session(`gemm:${transA}:${transB}`, () => gemmGraph(transA, transB));
        const rows = m * n;
        for (let p = 0; p < batch; p++) {
          const av = spec.batchedA ? a.subarray(p * m * k, (p + 1) * m * k) : a;
          const bv = spec.batchedB ? b.subarray(p * k * n, (p + 1) * k * n) : b;
          const cv = out.subarray(p * rows, (p + 1) * rows);
          s.run(
            { a: new T('float32', av, aDims), b: new T('float32', bv, bDims) },
            { c: new T('float32', cv, [m, n]) },
            {},
          );
        }
        return;
      }
      const s = session(`batched:${transA}:${transB}`, () => batchedGraph(transA, transB));
      s.run(
        {
          a: new T('float32', a, [spec.batchedA ? batch : 1, ...aDims]),
          b: new T('float32', b, [spec.batchedB ? batch : 1, ...bDims]),
        },
        { c: new T('float32', out, [batch, m, n]) },
        {},
      );
    },
  };
}
