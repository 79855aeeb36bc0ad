// The tab's GPU: onnxruntime-web's WebGPU provider, in a Web Worker. Its WebAssembly runtime (the provider's host side)
// is served by the validator beside the page (/lend/ort/, copied there by scripts/build-dashboard.mjs): nothing comes
// from a CDN. `openTabGpu` says why not where this browser gives no adapter or the provider does not start, and the
// tab then computes on its CPU engines (browser-wasm, browser-js).
import * as ort from 'onnxruntime-web/webgpu';
import { encodeModel, OnnxType } from '../tensor/index.ts';

/** The runtime files the page server serves under /lend/ort/ (the WebGPU build's; see scripts/build-dashboard.mjs). */
export const ORT_FILES = ['ort-wasm-simd-threaded.asyncify.mjs', 'ort-wasm-simd-threaded.asyncify.wasm'] as const;

/** A graph loaded on the tab's GPU: values on the host or the GPU in; its outputs on the host, or the GPU where asked. */
export type GpuGraph = ort.InferenceSession;

/** The tab's GPU, opened (see openTabGpu). */
export interface TabGpu {
  /** What the browser says of its adapter (vendor, architecture). */
  adapter: string;
  /** Loads a graph on the GPU; the outputs named in `onGpu` stay there (their values' `dispose()` frees them). */
  load(model: Uint8Array, onGpu?: readonly string[]): Promise<GpuGraph>;
  /** A GPU copy of host values, shaped `dims` (its `dispose()` frees it). */
  upload(data: Float32Array | Int32Array, dims: readonly number[]): Promise<ort.Tensor>;
}

/** What this file uses of a GPUDevice (TypeScript's DOM library has no WebGPU types). */
interface GpuDeviceLike {
  createBuffer(descriptor: { size: number; usage: number }): { destroy(): void };
  queue: { writeBuffer(buffer: unknown, offset: number, data: ArrayBufferView): void };
}
/** GPUBufferUsage.STORAGE | COPY_SRC | COPY_DST: what onnxruntime-web reads, and copies from and to. */
const STORAGE_USAGE = 0x80 | 0x04 | 0x08;

interface GpuAdapterLike {
  info?: { vendor?: string; architecture?: string; description?: string };
}
interface NavigatorGpu {
  gpu?: { requestAdapter(): Promise<GpuAdapterLike | null> };
}

let opened: Promise<TabGpu | string> | undefined;
/** Sessions kept for the Web Worker's life (see open). */
const keep: GpuGraph[] = [];

/**
 * Opens the GPU once per Web Worker: a WebGPU adapter, onnxruntime-web's WebGPU provider, and a
 * product computed there and checked against the host's. Resolves to the GPU, or to why there is none.
 * @example
 * const gpu = await openTabGpu()
 * if (typeof gpu === 'string') console.log(`no GPU: ${gpu}`)
 */
export function openTabGpu(): Promise<TabGpu | string> {
  opened ??= open().catch((err: unknown) => `onnxruntime-web's WebGPU provider did not start: ${(err as Error).message}`);
  return opened;
}

async function open(): Promise<TabGpu | string> {
  const gpu = (navigator as NavigatorGpu).gpu;
  if (gpu === undefined) return 'this browser has no WebGPU (navigator.gpu)';
  const adapter = await gpu.requestAdapter();
  if (adapter === null) return 'WebGPU gave no adapter';
  const info = adapter.info ?? {};
  // the runtime from the validator that served the page, one thread (a tab is not cross-origin isolated)
  ort.env.wasm.wasmPaths = new URL('ort/', import.meta.url).href;
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.proxy = false;
  ort.env.logLevel = 'error';
  const load = (model: Uint8Array, onGpu: readonly string[] = []) => ort.InferenceSession.create(model, {
    executionProviders: ['webgpu'], graphOptimizationLevel: 'all', executionMode: 'sequential', logSeverityLevel: 3,
    ...(onGpu.length > 0 ? { preferredOutputLocation: Object.fromEntries(onGpu.map((n) => [n, 'gpu-buffer' as const])) } : {}),
  });
  // a check that the provider computes: [2, 3] · [3, 2]
  const probe = await load(encodeModel(
    [{ op: 'MatMul', inputs: ['a', 'b'], outputs: ['y'] }],
    [{ name: 'a', type: OnnxType.float32, shape: [2, 3] }, { name: 'b', type: OnnxType.float32, shape: [3, 2] }],
    [{ name: 'y', type: OnnxType.float32, shape: [2, 2] }],
  ));
  const out = await probe.run({
    a: new ort.Tensor('float32', Float32Array.of(1, 2, 3, 4, 5, 6), [2, 3]),
    b: new ort.Tensor('float32', Float32Array.of(1, 0, 0, 1, 1, 1), [3, 2]),
  });
  const y = [...(out.y.data as Float32Array)];
  // the probe is kept: onnxruntime-web lets its GPU device go with its last session, and the buffers made on it below
  // (a section's weights) must outlive every session
  keep.push(probe);
  if (y.join() !== '4,5,10,11') return `WebGPU computed [${y.join()}] for a product whose answer is [4,5,10,11]`;
  // onnxruntime-web's device, made by the session above: where the tab's own buffers (weights) are made
  const device = (await ort.env.webgpu.device) as unknown as GpuDeviceLike;
  const upload = async (data: Float32Array | Int32Array, dims: readonly number[]) => {
    const buffer = device.createBuffer({ size: Math.ceil(data.byteLength / 16) * 16, usage: STORAGE_USAGE });
    device.queue.writeBuffer(buffer, 0, data);
    const dataType = data instanceof Int32Array ? 'int32' as const : 'float32' as const;
    return ort.Tensor.fromGpuBuffer(buffer as never, { dataType, dims, dispose: () => buffer.destroy() }) as ort.Tensor;
  };
  return { adapter: [info.vendor, info.architecture, info.description].filter((x) => x).join(' ') || 'unnamed', load, upload };
}

/**
 * The GPU's speed at a 256³ matrix product as one graph (GFLOP/s, host copies included): what the
 * tab announces, as the CPU engines announce theirs.
 */
export async function gpuGflops(gpu: TabGpu): Promise<number> {
  const n = 256;
  const session = await gpu.load(encodeModel(
    [{ op: 'MatMul', inputs: ['a', 'b'], outputs: ['y'] }],
    [{ name: 'a', type: OnnxType.float32, shape: [n, n] }, { name: 'b', type: OnnxType.float32, shape: [n, n] }],
    [{ name: 'y', type: OnnxType.float32, shape: [n, n] }],
  ));
  const a = new ort.Tensor('float32', new Float32Array(n * n).fill(0.5), [n, n]);
  await session.run({ a, b: a });
  let runs = 0;
  const t0 = performance.now();
  while (runs < 3 || performance.now() - t0 < 300) {
    await session.run({ a, b: a });
    runs++;
  }
  const seconds = (performance.now() - t0) / 1000;
  await session.release();
  return (2 * n ** 3 * runs) / seconds / 1e9;
}
