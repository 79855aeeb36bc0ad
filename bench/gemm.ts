import * as ort from 'onnxruntime-node';
import { encodeModel, OnnxType } from '../src/tensor/backends/ort/onnx-graph.ts';
import { createOrtBackend, jsBackend, matmul, noGrad, randn, withBackend } from '../src/tensor/index.ts';
import { jsBackendWith } from '../src/tensor/backends/js/backend.ts';
import { gemmNN } from '../src/tensor/kernels/matmul.ts';
import { blockedGemm } from './baselines/blocked-gemm.ts';
import { timeBlocks, timePair } from './timing.ts';

export interface Row {
  section: string;
  case: string;
  value: number;
  unit: string;
  reference: string;
  referenceValue: number;
  /** value / referenceValue (higher is better for rates, lower for times) */
  ratio: number;
  target?: string;
}

export const GEMM_SHAPES: [number, number, number][] = [
  [512, 768, 768],
  [512, 768, 3072],
  [1, 768, 3072],
];

const gflops = (m: number, k: number, n: number, ms: number) => (2 * m * k * n) / (ms * 1e6);

function matmulModel(): Uint8Array {
  return encodeModel(
    [{ op: 'MatMul', inputs: ['a', 'b'], outputs: ['c'] }],
    [
      { name: 'a', type: OnnxType.float32, shape: ['m', 'k'] },
      { name: 'b', type: OnnxType.float32, shape: ['k', 'n'] },
    ],
    [{ name: 'c', type: OnnxType.float32, shape: ['m', 'n'] }],
  );
}

/** Engine GEMM (ort backend) against raw onnxruntime-node's public API at the same threads. */
export async function benchOrtGemm(threads: number[]): Promise<Row[]> {
  const rows: Row[] = [];
  for (const t of threads) {
    const session = await ort.InferenceSession.create(matmulModel(), {
      intraOpNumThreads: t,
      interOpNumThreads: 1,
      executionMode: 'sequential',
      graphOptimizationLevel: 'all',
    });
    const auto = createOrtBackend({ threads: t });
    const spinning = createOrtBackend({ threads: t, spinning: true });
    for (const [m, k, n] of GEMM_SHAPES) {
      const a = randn([m, k], { seed: 1 });
      const b = randn([k, n], { seed: 2 });
      const feeds = {
        a: new ort.Tensor('float32', a.data as Float32Array, [m, k]),
        b: new ort.Tensor('float32', b.data as Float32Array, [k, n]),
      };
      for (const [label, backend] of [
        ['', auto],
        [', spinning pool', spinning],
      ] as const) {
        if (t === 1 && label !== '') continue;
        const [raw, engine] = await timeBlocks(
          () => session.run(feeds),
          () => withBackend(backend, () => noGrad(() => matmul(a, b))),
        );
        const value = gflops(m, k, n, engine);
        const ref = gflops(m, k, n, raw);
        rows.push({
          section: 'gemm',
          case: `${m}x${k}x${n} ort, ${t} thread${t > 1 ? 's' : ''}${label}`,
          value,
          unit: 'GFLOP/s',
          reference: 'raw onnxruntime-node',
          referenceValue: ref,
          ratio: value / ref,
          target: '≥ 0.9',
        });
      }
    }
    await session.release();
  }
  return rows;
}

/**
 * The js backend against a conventional blocked TypeScript GEMM: as it runs (its GEMM in WebAssembly SIMD where that
 * runs) and with its TypeScript GEMM (what a tab without WebAssembly SIMD runs): the same bits.
 */
export async function benchJsGemm(): Promise<Row[]> {
  const rows: Row[] = [];
  for (const [m, k, n] of GEMM_SHAPES) {
    const a = randn([m, k], { seed: 1 });
    const b = randn([k, n], { seed: 2 });
    const c = new Float32Array(m * n);
    const opts = { warmup: 1, minRuns: 2, budgetMs: 4000 };
    for (const [label, backend] of [['js', jsBackend], ['js, TypeScript GEMM', jsBackendWith(gemmNN)]] as const) {
      const [baseline, engine] = await timePair(
        () => blockedGemm(a.data as Float32Array, b.data as Float32Array, c, m, k, n),
        () => withBackend(backend, () => noGrad(() => matmul(a, b))),
        opts,
      );
      const value = gflops(m, k, n, engine);
      const ref = gflops(m, k, n, baseline);
      rows.push({
        section: 'gemm',
        case: `${m}x${k}x${n} ${label}`,
        value,
        unit: 'GFLOP/s',
        reference: 'blocked TypeScript GEMM',
        referenceValue: ref,
        ratio: value / ref,
        target: '≥ 0.5',
      });
    }
  }
  return rows;
}

/** Where the ort backend starts to pay off: small products, js against ort (1 thread). */
export async function benchCrossover(): Promise<Row[]> {
  const backend = createOrtBackend({ threads: 1, minMacs: 0 });
  const rows: Row[] = [];
  for (const s of [8, 16, 32, 48, 64, 128]) {
    const a = randn([s, s], { seed: 1 });
    const b = randn([s, s], { seed: 2 });
    const [js, fast] = await timePair(
      () => withBackend(jsBackend, () => noGrad(() => matmul(a, b))),
      () => withBackend(backend, () => noGrad(() => matmul(a, b))),
      { budgetMs: 300 },
    );
    rows.push({
      section: 'crossover',
      case: `${s}x${s}x${s} (${s ** 3} MACs) ort vs js`,
      value: fast * 1000,
      unit: 'µs',
      reference: 'js backend',
      referenceValue: js * 1000,
      ratio: fast / js,
    });
  }
  return rows;
}
