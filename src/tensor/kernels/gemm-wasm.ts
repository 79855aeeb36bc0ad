// The js backend's GEMM in WebAssembly SIMD (gemm.wat): gemmNN's sums in gemmNN's order, so its results are the
// TypeScript kernel's to the bit, 5–8× faster (f64x2 lanes). It works on copies of the operands in the module's memory,
// a block of rows and columns at a time: each output is still one sum over all of k, so the blocking changes nothing.
import type { FloatArray } from '../dtype.ts';
import { GEMM_WASM_BASE64 } from './gemm-wasm-bytes.ts';
import type { GemmNN } from './matmul.ts';

/** The part of WebAssembly's API used here (typed locally: the project's build has no DOM types). */
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

/** gemm.wat's module. */
export const GEMM_WASM: Uint8Array<ArrayBuffer> = Uint8Array.from(atob(GEMM_WASM_BASE64), (c) => c.charCodeAt(0));

/** Bytes of float64 scratch the kernel sums in (4 rows × 256 columns). */
const ACC_BYTES = 4 * 256 * 8;
/** The most floats of operands the module's memory holds at once (16 MiB); larger products go in blocks. */
const MAX_FLOATS = 4 * 1024 * 1024;
/** Columns of a block when the product does not fit (a multiple of the kernel's 256), fewer when k is long. */
const BLOCK_COLUMNS = 1024;

/** Whether this engine runs the module (WebAssembly SIMD: Node 16.4+, Chrome 91+, Firefox 89+, Safari 16.4+). */
export function wasmRuns(): boolean {
  try {
    return wasm !== undefined && wasm.validate(GEMM_WASM);
  } catch {
    return false;
  }
}

/**
 * gemmNN by the module, in an instance of its own. Float32 operands only; anything else, and products too long in k for
 * a block of the memory, go to `fallback` (gemmNN: the same sums). `maxFloats` bounds the memory it holds (tests use a
 * small one to exercise the blocks).
 */
export function wasmGemm(fallback: GemmNN, maxFloats = MAX_FLOATS): GemmNN {
  if (!wasm) throw new Error('this engine has no WebAssembly');
  const instance = new wasm.Instance(new wasm.Module(GEMM_WASM));
  const memory = instance.exports.memory as WasmMemory;
  const kernel = instance.exports.gemm_nn as (a: number, b: number, c: number, m: number, k: number, n: number, acc: number) => void;
  const heapOf = (floats: number) => {
    const need = ACC_BYTES + 4 * floats;
    if (need > memory.buffer.byteLength) memory.grow(Math.ceil((need - memory.buffer.byteLength) / 65_536));
    return new Float32Array(memory.buffer);
  };
  return (A: FloatArray, aOff: number, B: FloatArray, bOff: number, C: FloatArray, cOff: number, m: number, k: number, n: number) => {
    if (!(A instanceof Float32Array && B instanceof Float32Array && C instanceof Float32Array)) {
      fallback(A, aOff, B, bOff, C, cOff, m, k, n);
      return;
    }
    if (m * k + k * n + m * n <= maxFloats) {
      // the whole product at once: A, B, then C after the scratch
      const heap = heapOf(m * k + k * n + m * n);
      const a = ACC_BYTES / 4;
      const b = a + m * k;
      const c = b + k * n;
      heap.set(A.subarray(aOff, aOff + m * k), a);
      heap.set(B.subarray(bOff, bOff + k * n), b);
      kernel(4 * a, 4 * b, 4 * c, m, k, n, 0);
      C.set(heap.subarray(c, c + m * n), cOff);
      return;
    }
    // in blocks: columns of B (and C) `w` at a time (B's block at most half the memory), rows of A (and C) `rows` at a time
    const w = Math.min(n, BLOCK_COLUMNS, Math.max(1, Math.floor(maxFloats / (2 * k))));
    const rows = Math.min(m, Math.floor((maxFloats - k * w) / (k + w)));
    if (rows < Math.min(m, 4)) {
      fallback(A, aOff, B, bOff, C, cOff, m, k, n);
      return;
    }
    const heap = heapOf(rows * k + k * w + rows * w);
    const a = ACC_BYTES / 4;
    const b = a + rows * k;
    const c = b + k * w;
    for (let i0 = 0; i0 < m; i0 += rows) {
      const mi = Math.min(rows, m - i0);
      heap.set(A.subarray(aOff + i0 * k, aOff + (i0 + mi) * k), a);
      for (let j0 = 0; j0 < n; j0 += w) {
        const wj = Math.min(w, n - j0);
        for (let p = 0; p < k; p++) heap.set(B.subarray(bOff + p * n + j0, bOff + p * n + j0 + wj), b + p * wj);
        kernel(4 * a, 4 * b, 4 * c, mi, k, wj, 0);
        for (let r = 0; r < mi; r++) C.set(heap.subarray(c + r * wj, c + (r + 1) * wj), cOff + (i0 + r) * n + j0);
      }
    }
  };
}
