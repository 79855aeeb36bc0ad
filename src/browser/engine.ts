// The tab's engine, in a Web Worker (the page stays responsive while it computes): TensorLink's js backend with its
// TypeScript GEMM (browser-js), and with its GEMM in WebAssembly SIMD (browser-wasm, the same bits). Measures each one's speed
// and computes the seeded reference forward whose logits every machine must reproduce bit for bit
// (src/worker/engine-check.ts); then opens the GPU where WebGPU gives an adapter (browser-webgpu: onnxruntime-web's WebGPU
// provider, gpu.ts) and measures it. Posts { gflops, wasmGflops, logitsSha256, wasmSha256, ms, webgpu | webgpuError,
// webgpuGflops } to the page.
import './globals.ts';
import { sha256 } from '@noble/hashes/sha2.js';
import { bytesToHex } from '@noble/hashes/utils.js';
import { fastGemm, gemmNN, jsBackend, jsBackendWith, setBackend } from '../tensor/index.ts';
import { engineGflops, referenceLogits } from '../worker/index.ts';
import { gpuGflops, openTabGpu } from './gpu.ts';

const fingerprint = (logits: Float32Array) => bytesToHex(sha256(new Uint8Array(logits.buffer, logits.byteOffset, logits.byteLength)));

try {
  setBackend(jsBackendWith(gemmNN));
  const t0 = performance.now();
  const logitsSha256 = fingerprint(referenceLogits());
  const ms = performance.now() - t0;
  const gflops = engineGflops();
  let wasm: { wasmGflops: number; wasmSha256: string } | Record<string, never> = {};
  // the js backend itself runs the WebAssembly GEMM where this browser runs WebAssembly SIMD
  if (fastGemm !== gemmNN) {
    setBackend(jsBackend);
    wasm = { wasmSha256: fingerprint(referenceLogits()), wasmGflops: engineGflops() };
  }
  const gpu = await openTabGpu();
  const webgpu = typeof gpu === 'string' ? { webgpuError: gpu } : { webgpu: gpu.adapter, webgpuGflops: await gpuGflops(gpu) };
  postMessage({ gflops, logitsSha256, ms, ...wasm, ...webgpu });
} catch (err) {
  postMessage({ error: (err as Error).message });
}
