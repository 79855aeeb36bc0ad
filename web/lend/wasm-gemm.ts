// The tab's WebAssembly engine (browser-wasm): the js backend with its GEMM in WebAssembly SIMD (gemm.wat, assembled
// by scripts/build-dashboard.mjs). It computes the js backend's sums in the js backend's order, so its results (and the
// records a tab signs, which say `js`) are the js backend's to the bit; everything else is the js backend itself.
import type { Backend } from '../../src/tensor/backends/backend.ts';
import type { FloatArray } from '../../src/tensor/dtype.ts';
import { addRowBias, gemmNN, type GemmNN, matmulJs } from '../../src/tensor/kernels/matmul.ts';

/** The part of WebAssembly's API used here (typed locally: the project's Node build has no DOM types). */
interface WasmApi {
  Module: new (bytes: Uint8Array<ArrayBuffer>) => object;
  Instance: new (module: object) => { exports: Record<string, unknown> };
  validate(bytes: Uint8Array<ArrayBuffer>): boolean;
}
interface WasmMemory {
  buffer: ArrayBuffer;
  grow(pages: number): number;
}
const wasm = (globalThis as unknown as { WebAssembly?: WasmApi }).WebAssembly;

/** Bytes of float64 scratch the kernel sums in (4 rows × 256 columns). */
const ACC_BYTES = 4 * 256 * 8;

/** gemmNN by the WebAssembly module `bytes` (float32 operands; anything else goes to the TypeScript kernel). */
export function wasmGemm(bytes: Uint8Array<ArrayBuffer>): GemmNN {
  if (!wasm) throw new Error('this engine has no WebAssembly');
  const instance = new wasm.Instance(new wasm.Module(bytes));
  const memory = instance.exports.memory as WasmMemory;
  const gemm = instance.exports.gemm_nn as (a: number, b: number, c: number, m: number, k: number, n: number, acc: number) => void;
  return (A: FloatArray, aOff: number, B: FloatArray, bOff: number, C: FloatArray, cOff: number, m: number, k: number, n: number) => {
    if (!(A instanceof Float32Array && B instanceof Float32Array && C instanceof Float32Array)) {
      gemmNN(A, aOff, B, bOff, C, cOff, m, k, n);
      return;
    }
    const a = ACC_BYTES;
    const b = a + 4 * m * k;
    const c = b + 4 * k * n;
    const need = c + 4 * m * n;
    if (need > memory.buffer.byteLength) memory.grow(Math.ceil((need - memory.buffer.byteLength) / 65_536));
    const heap = new Float32Array(memory.buffer);
    heap.set(A.subarray(aOff, aOff + m * k), a / 4);
    heap.set(B.subarray(bOff, bOff + k * n), b / 4);
    gemm(a, b, c, m, k, n, 0);
    C.set(new Float32Array(memory.buffer, c, m * n), cOff);
  };
}

/** Whether this browser runs the module (WebAssembly SIMD: Chrome 91+, Firefox 89+, Safari 16.4+). */
export function wasmRuns(bytes: Uint8Array<ArrayBuffer>): boolean {
  return wasm !== undefined && wasm.validate(bytes);
}

/** The js backend with the WebAssembly GEMM: named `js`, for its results are the js backend's. */
export function wasmBackend(bytes: Uint8Array<ArrayBuffer>): Backend {
  const nn = wasmGemm(bytes);
  return {
    name: 'js',
    deterministic: true,
    matmul(a: FloatArray, b: FloatArray, out: FloatArray, spec, bias?: FloatArray): void {
      matmulJs(a, b, out, spec, nn);
      if (bias) addRowBias(out, bias);
    },
  };
}
