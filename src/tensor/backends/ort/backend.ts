import { availableParallelism } from 'node:os';
import type { FloatArray } from '../../dtype.ts';
import { addRowBias, type MatmulSpec, matmulJs } from '../../kernels/matmul.ts';
import type { TimeMajorAttentionSpec } from '../../ops/attention.ts';
import type { PackedMatrix, QuantFormat } from '../../quant/formats.ts';
import type { TracedStep } from '../../trace.ts';
import type { Backend, LinearWeight, Tolerance } from '../backend.ts';
import {
  batchedMatmulGraph,
  gemmGraph,
  layerNormGraph,
  maskedSoftmaxGraph,
  timeMajorAttentionGraph,
  ORT_UNARY,
  ORT_UNARY_BACKWARD,
  type OrtUnary,
  type OrtUnaryBackward,
  unaryBackwardGraph,
  unaryGraph,
} from './graphs.ts';
import { bf16LinearChunked, type FusedWeight, fusedGatedMlpGraph, fusedLinearsGraph, matMulNBitsGraph } from './packed.ts';
import { compileOrtStep } from './compiled-step.ts';
import { loadOrtRuntime, type OrtRuntimeKind, type OrtSession } from './runtime.ts';

/**
 * Matrix products, transcendental elementwise ops, softmax and layer norm through onnxruntime's CPU kernels
 * (MLAS), called synchronously so that the engine stays eager. Each op is a tiny cached
 * graph; its inputs and outputs are our own buffers (see runtime.ts for the ways in).
 * Products with a compact weight: int8/int4 through MatMulNBits, one graph per weight (packed.ts).
 */

/** Below this many multiply-adds the native call costs more than the js kernel (measured: bench/run.ts). */
export const ORT_MIN_MACS = 32 * 1024;
/** Below this many elements a transcendental op is cheaper in js than a native call (~15 µs). */
export const ORT_MIN_ELEMENTS = 4096;

/**
 * How far ort's results may lie from the js kernels' (see Tolerance): verify/compare.ts's
 * ORT_TOLERANCES, where their derivation and measurements are (a test checks that the two
 * agree). float32 and bf16 (widened exactly): MLAS sums float32 products in its own order; int8
 * and int4: MatMulNBits quantizes activations to int8 blocks.
 */
export const ORT_BACKEND_TOLERANCE: Tolerance = Object.freeze({ f32: 3e-5, bf16: 3e-5, int8: 0.1, int4: 0.08 });

/** True when onnxruntime loads here (through either runtime). */
export function ortAvailable(): boolean {
  try {
    loadOrtRuntime();
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
  /** How to reach onnxruntime (default: 'ffi' where it loads, else 'binding'). */
  runtime?: OrtRuntimeKind;
  /**
   * Whether a traced step runs as one ONNX graph (compiled-step.ts; default true) rather than
   * op by op on this backend's kernels.
   */
  compileSteps?: boolean;
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
export function createOrtBackend(options: OrtBackendOptions = {}): Backend & { threads: number; runtime: OrtRuntimeKind } {
  const ort = loadOrtRuntime(options.runtime);
  const threads = options.threads ?? availableParallelism();
  const minMacs = options.minMacs ?? ORT_MIN_MACS;
  const minElements = options.minElements ?? ORT_MIN_ELEMENTS;
  const spinning = options.spinning ?? 'auto';
  const sessions = new Map<string, OrtSession>();
  /** Sessions held for compact weights (packed and fused ones), counted as they are made and released. */
  let packedHeld = 0;
  /**
   * Bytes of the prepacked copies held for each compact weight, by the weight its sessions are kept under (a fused
   * group's under its first compact weight): a session holds one copy of each compact weight in its graph.
   */
  const prepacked = new WeakMap<PackedMatrix, number>();
  const keep = (key: PackedMatrix, ws: readonly PackedMatrix[]) => {
    packedHeld++;
    prepacked.set(key, (prepacked.get(key) ?? 0) + ws.reduce((n, w) => n + w.data.byteLength + w.scales.byteLength, 0));
  };

  function session(key: string, build: () => Uint8Array, spin = spinning === true, poolThreads = threads): OrtSession {
    const fullKey = `${key}:${spin}:${poolThreads}`;
    let s = sessions.get(fullKey);
    if (s === undefined) {
      s = ort.session(build(), poolThreads, spin);
      sessions.set(fullKey, s);
    }
    return s;
  }

  /** Additive masks for softmax by shape: 0 where a query may attend, −∞ elsewhere. */
  const masks = new Map<string, Float32Array>();
  const softmaxMask = (tq: number, tk: number, causal: boolean) => {
    const key = `${tq}:${tk}:${causal}`;
    let mask = masks.get(key);
    if (mask === undefined) {
      mask = new Float32Array(tq * tk);
      if (causal) for (let i = 0; i < tq; i++) mask.fill(Number.NEGATIVE_INFINITY, i * tk + i + tk - tq + 1, (i + 1) * tk);
      if (masks.size > 64) masks.clear();
      masks.set(key, mask);
    }
    return mask;
  };
  /** Additive masks of time-major attention: rows of `groups` heads × tq queries over tk keys, causal. */
  const attentionMask = (groups: number, tq: number, tk: number) => {
    const key = `attention:${groups}:${tq}:${tk}`;
    let mask = masks.get(key);
    if (mask === undefined) {
      mask = new Float32Array(groups * tq * tk);
      for (let r = 0; r < groups * tq; r++) mask.fill(Number.NEGATIVE_INFINITY, r * tk + (r % tq) + tk - tq + 1, (r + 1) * tk);
      if (masks.size > 64) masks.clear();
      masks.set(key, mask);
    }
    return mask;
  };
  /**
   * MatMulNBits sessions of each int8/int4 weight, by pool size. Each session holds its own prepacked copy of the
   * weight, so the spinning policy is the weight's own (that of a one-row product, decoding), not each call's.
   */
  const packedSessions = new WeakMap<PackedMatrix, Map<number, OrtSession>>();
  const packedSession = (w: PackedMatrix & { format: QuantFormat }, poolThreads: number) => {
    let byPool = packedSessions.get(w);
    if (byPool === undefined) packedSessions.set(w, (byPool = new Map()));
    let s = byPool.get(poolThreads);
    if (s === undefined) {
      // every packed weight has a session and so a pool of its own: a hundred spinning pools would fight for two cores
      // (int4 decode of a 100M decoder at 2 threads: 2.6 tok/s spinning under 'auto', 42 tok/s asleep), so they spin only when told
      s = ort.session(matMulNBitsGraph(w), poolThreads, spinning === true);
      byPool.set(poolThreads, s);
      keep(w, [w]);
    }
    return s;
  };
  /**
   * Sessions of fused products (fusedLinearsGraph, fusedGatedMlpGraph): by their first compact weight (a session holds
   * prepacked copies of its compact weights, so it lives as long as they do), or by shapes when all are float32.
   */
  const fusedSessions = new WeakMap<PackedMatrix, Map<string, OrtSession>>();
  const fusedIds = new WeakMap<PackedMatrix, number>();
  let nextFusedId = 0;
  const fusedSession = (kind: string, ws: readonly FusedWeight[], build: () => Uint8Array, poolThreads: number) => {
    const key = `${kind}:${poolThreads}:${ws.map((w) => {
      if (w.format === 'f32') return `f32 ${w.rows}x${w.cols}`;
      let id = fusedIds.get(w);
      if (id === undefined) fusedIds.set(w, (id = nextFusedId++));
      return `#${id}`;
    }).join(',')}`;
    const first = ws.find((w): w is PackedMatrix & { format: QuantFormat } => w.format !== 'f32');
    if (first === undefined) return session(key, build, false, poolThreads);
    let byKey = fusedSessions.get(first);
    if (byKey === undefined) fusedSessions.set(first, (byKey = new Map()));
    let s = byKey.get(key);
    if (s === undefined) {
      byKey.set(key, (s = ort.session(build(), poolThreads, spinning === true)));
      keep(first, ws.filter((w): w is PackedMatrix & { format: QuantFormat } => w.format !== 'f32'));
    }
    return s;
  };
  /** The weights as fused graphs take them, or null where one is held in bf16 (its own chunked path). */
  const fusedWeights = (ws: readonly LinearWeight[]): FusedWeight[] | null => {
    const out: FusedWeight[] = [];
    for (const w of ws) {
      if (w.packed !== null) {
        if (w.packed.format === 'bf16') return null;
        out.push(w.packed as PackedMatrix & { format: QuantFormat });
      } else if (w.values !== null) out.push({ format: 'f32', rows: w.rows, cols: w.cols });
      else return null;
    }
    return out;
  };
  /** The float32 weights among `ws` as run inputs named as fused graphs name them. */
  const weightFeeds = (ws: readonly LinearWeight[]) =>
    ws.flatMap((w, i) => (w.packed === null && w.values !== null ? [{ name: `w${i}`, data: w.values, dims: [w.rows, w.cols] }] : []));
  /** Threads for elementwise work on this many elements (small work stays on the calling thread). */
  const pool = (elements: number) => (elements < SINGLE_THREAD_BELOW_ELEMENTS ? 1 : threads);

  const releasePacked = (weights: Iterable<PackedMatrix>) => {
    for (const w of weights) {
      for (const held of [packedSessions.get(w), fusedSessions.get(w)]) {
        for (const s of held?.values() ?? []) {
          s.release();
          packedHeld--;
        }
      }
      packedSessions.delete(w);
      fusedSessions.delete(w);
      prepacked.delete(w);
    }
  };
  const prepackedBytes = (weights: Iterable<PackedMatrix>) => {
    let bytes = 0;
    for (const w of weights) bytes += prepacked.get(w) ?? 0;
    return bytes;
  };
  return {
    name: 'ort',
    releasePacked,
    packedSessions: () => packedHeld,
    prepackedBytes,
    deterministic: false,
    device: 'cpu',
    tolerance: ORT_BACKEND_TOLERANCE,
    threads,
    runtime: ort.kind,
    ...(options.compileSteps === false
      ? {}
      : { compileStep: (step: TracedStep) => compileOrtStep(step, (model) => ort.session(model, threads, spinning === true)) }),
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
          const bv = (spec.batchedB ? b.subarray(p * k * n, (p + 1) * k * n) : b) as Float32Array;
          const cv = (out as Float32Array).subarray(p * rows, (p + 1) * rows);
          const inputs = [
            { name: 'a', data: av, dims: aDims },
            { name: 'b', data: bv, dims: bDims },
          ];
          if (withBias) inputs.push({ name: 'bias', data: bias, dims: [n] });
          s.run(inputs, [{ name: 'c', data: cv, dims: [m, n] }]);
        }
        if (bias && !withBias) addRowBias(out, bias);
        return;
      }
      const s = session(`batched:${transA}:${transB}`, () => batchedMatmulGraph(transA, transB), spin, poolThreads);
      s.run(
        [
          { name: 'a', data: a, dims: [spec.batchedA ? batch : 1, ...aDims] },
          { name: 'b', data: b as Float32Array, dims: [spec.batchedB ? batch : 1, ...bDims] },
        ],
        [{ name: 'c', data: out as Float32Array, dims: [batch, m, n] }],
      );
      if (bias) addRowBias(out, bias);
    },
    packedLinear(x: Float32Array, m: number, w: PackedMatrix, y: Float32Array): boolean {
      const { rows: n, cols: k } = w;
      const macs = m * n * k;
      if (macs === 0 || macs < minMacs) return false;
      const poolThreads = macs < SINGLE_THREAD_BELOW_MACS ? 1 : threads;
      if (w.format === 'bf16') {
        // js widens each chunk between the native calls: a spinning pool would take its core.
        const s = session('gemm:false:true:false', () => gemmGraph(false, true), spinning === true, poolThreads);
        bf16LinearChunked(x, m, w, y, (b, rows, out) =>
          s.run(
            [
              { name: 'a', data: x, dims: [m, k] },
              { name: 'b', data: b, dims: [rows, k] },
            ],
            [{ name: 'c', data: out, dims: [m, rows] }],
          ));
        return true;
      }
      const s = packedSession(w as PackedMatrix & { format: QuantFormat }, poolThreads);
      s.run([{ name: 'a', data: x, dims: [m, k] }], [{ name: 'y', data: y, dims: [m, n] }]);
      return true;
    },
    unary(op: string, x: FloatArray, y: FloatArray): boolean {
      if (!(x instanceof Float32Array) || x.length < minElements || !ORT_UNARY.has(op)) return false;
      const s = session(`unary:${op}`, () => unaryGraph(op as OrtUnary), false, pool(x.length));
      s.run([{ name: 'x', data: x, dims: [x.length] }], [{ name: 'y', data: y as Float32Array, dims: [y.length] }]);
      return true;
    },
    softmax(x: FloatArray, y: FloatArray, blocks: number, tq: number, tk: number, scale: number, causal: boolean): boolean {
      if (!(x instanceof Float32Array) || x.length < minElements) return false;
      const s = session('softmax', maskedSoftmaxGraph, false, pool(x.length));
      s.run(
        [
          { name: 'x', data: x, dims: [blocks, tq, tk] },
          { name: 's', data: Float32Array.of(scale), dims: [1] },
          { name: 'mask', data: softmaxMask(tq, tk, causal), dims: [tq, tk] },
        ],
        [{ name: 'y', data: y as Float32Array, dims: [blocks, tq, tk] }],
      );
      return true;
    },
    layerNorm(x: FloatArray, w: FloatArray, b: FloatArray, eps: number, y: FloatArray, mean: Float32Array, rstd: Float32Array): boolean {
      if (!(x instanceof Float32Array) || x.length < minElements) return false;
      const n = w.length;
      const rows = x.length / n;
      const s = session(`layer-norm:${eps}`, () => layerNormGraph(eps), false, pool(x.length));
      s.run(
        [
          { name: 'x', data: x, dims: [rows, n] },
          { name: 'w', data: w as Float32Array, dims: [n] },
          { name: 'b', data: b as Float32Array, dims: [n] },
        ],
        [
          { name: 'y', data: y as Float32Array, dims: [rows, n] },
          { name: 'mean', data: mean, dims: [rows, 1] },
          { name: 'rstd', data: rstd, dims: [rows, 1] },
        ],
      );
      return true;
    },
    linears(x: Float32Array, m: number, ws: readonly LinearWeight[], ys: readonly Float32Array[]): boolean {
      const fused = fusedWeights(ws);
      const k = ws[0]?.cols ?? 0;
      const macs = m * k * ws.reduce((n, w) => n + w.rows, 0);
      if (fused === null || macs === 0 || macs < minMacs) return false;
      const s = fusedSession('linears', fused, () => fusedLinearsGraph(fused), macs < SINGLE_THREAD_BELOW_MACS ? 1 : threads);
      s.run([{ name: 'a', data: x, dims: [m, k] }, ...weightFeeds(ws)], ys.map((y, i) => ({ name: `y${i}`, data: y, dims: [m, ws[i].rows] })));
      return true;
    },
    gatedMlp(x: Float32Array, m: number, gate: LinearWeight, up: LinearWeight, down: LinearWeight, y: Float32Array): boolean {
      const ws = [gate, up, down];
      const fused = fusedWeights(ws);
      const macs = m * gate.cols * gate.rows * 3;
      if (fused === null || macs < minMacs) return false;
      const s = fusedSession('gated-mlp', fused, () => fusedGatedMlpGraph(fused[0], fused[1], fused[2]), macs < SINGLE_THREAD_BELOW_MACS ? 1 : threads);
      s.run([{ name: 'a', data: x, dims: [m, gate.cols] }, ...weightFeeds(ws)], [{ name: 'y', data: y, dims: [m, down.rows] }]);
      return true;
    },
    attention(q: Float32Array, k: Float32Array, v: Float32Array, y: Float32Array, spec: TimeMajorAttentionSpec): boolean {
      const { heads, kvHeads, tq, tk, dim, scale } = spec;
      const macs = 2 * heads * tq * tk * dim;
      if (macs < minMacs) return false;
      const rows = (heads / kvHeads) * tq;
      // one query (decoding) sees every key: no mask
      const masked = tq > 1;
      const s = session(`time-major-attention:${masked}`, () => timeMajorAttentionGraph(masked), false, macs < SINGLE_THREAD_BELOW_MACS ? 1 : threads);
      const inputs = [
        { name: 'q', data: q, dims: [kvHeads, rows, dim] },
        { name: 'k', data: k, dims: [tk, kvHeads, dim] },
        { name: 'v', data: v, dims: [tk, kvHeads, dim] },
        { name: 's', data: Float32Array.of(scale), dims: [1] },
      ];
      if (masked) inputs.push({ name: 'mask', data: attentionMask(heads / kvHeads, tq, tk), dims: [rows, tk] });
      s.run(inputs, [{ name: 'y', data: y, dims: [kvHeads, rows, dim] }]);
      return true;
    },
    unaryBackward(op: string, x: FloatArray, g: FloatArray, gx: FloatArray): boolean {
      if (!(x instanceof Float32Array) || x.length < minElements || !ORT_UNARY_BACKWARD.has(op)) return false;
      const s = session(
        `unary-backward:${op}`,
        () => unaryBackwardGraph(op as OrtUnaryBackward),
        false,
        pool(x.length),
      );
      s.run(
        [
          { name: 'x', data: x, dims: [x.length] },
          { name: 'g', data: g as Float32Array, dims: [g.length] },
        ],
        [{ name: 'gx', data: gx as Float32Array, dims: [gx.length] }],
      );
      return true;
    },
  };
}
