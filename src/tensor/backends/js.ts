import type { FloatArray } from '../dtype.ts';
import { addRowBias, type MatmulSpec, matmulJs } from '../kernels/matmul.ts';
import type { Backend } from './backend.ts';

/** The portable reference backend: pure TypeScript, bitwise reproducible everywhere. */
export const jsBackend: Backend = {
  name: 'js',
  deterministic: true,
  matmul(a: FloatArray, b: FloatArray, out: FloatArray, spec: MatmulSpec, bias?: FloatArray): void {
    matmulJs(a, b, out, spec);
    if (bias) addRowBias(out, bias);
  },
};
