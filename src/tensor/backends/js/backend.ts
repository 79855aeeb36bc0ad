import type { FloatArray } from '../../dtype.ts';
import { addRowBias, fastGemm, type GemmNN, type MatmulSpec, matmulJs } from '../../kernels/matmul.ts';
import { type Backend, EXACT } from '../backend.ts';

/** The js backend with `nn` as its GEMM (gemmNN, or the WebAssembly kernel: the same bits either way). */
export function jsBackendWith(nn: GemmNN): Backend {
  return {
    name: 'js',
    deterministic: true,
    device: 'cpu',
    tolerance: EXACT,
    matmul(a: FloatArray, b: FloatArray, out: FloatArray, spec: MatmulSpec, bias?: FloatArray): void {
      matmulJs(a, b, out, spec, nn);
      if (bias) addRowBias(out, bias);
    },
  };
}

/**
 * The portable reference backend: typed arrays, bitwise reproducible everywhere. Its GEMM is gemm.wat's WebAssembly
 * SIMD where that runs (Node, browsers), TypeScript elsewhere (`fastGemm`).
 */
export const jsBackend: Backend = jsBackendWith(fastGemm);
