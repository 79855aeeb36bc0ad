/** What the tab measured of its engines (GFLOP/s of a 256³ product on each), as engine.ts posts it. */
export interface MeasuredEngines {
  /** The js backend with its TypeScript GEMM (browser-js). */
  gflops: number;
  /** With its GEMM in WebAssembly SIMD (browser-wasm), where that runs the same bits. */
  wasmGflops?: number;
  /** On the GPU (browser-webgpu), where WebGPU gives an adapter and onnxruntime-web starts on it. */
  webgpuGflops?: number;
}

export type TabEngine = 'webgpu' | 'wasm' | 'js';

/**
 * The engine a tab lends: the one `asked` for (`?engine=webgpu|wasm|js`) where it has it, else the GPU where it is
 * faster than the CPU's engine (a software adapter such as SwiftShader is not), else the WebAssembly GEMM where it
 * runs, else plain js; with its GFLOP/s.
 * @example
 * chooseEngine({ gflops: 2, wasmGflops: 7, webgpuGflops: 0.4 }, null)     // { engine: 'wasm', gflops: 7 }
 * chooseEngine({ gflops: 2, wasmGflops: 7, webgpuGflops: 0.4 }, 'webgpu') // { engine: 'webgpu', gflops: 0.4 }
 */
export function chooseEngine(measured: MeasuredEngines, asked: string | null): { engine: TabEngine; gflops: number } {
  const cpu = measured.wasmGflops ?? measured.gflops;
  const gpu = measured.webgpuGflops !== undefined && (asked === 'webgpu' || (asked === null && measured.webgpuGflops > cpu));
  if (gpu) return { engine: 'webgpu', gflops: measured.webgpuGflops! };
  const wasm = measured.wasmGflops !== undefined && asked !== 'js';
  return wasm ? { engine: 'wasm', gflops: measured.wasmGflops! } : { engine: 'js', gflops: measured.gflops };
}
