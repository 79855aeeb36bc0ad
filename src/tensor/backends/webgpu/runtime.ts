import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { BackendUnavailableError } from '../../../errors.ts';
import type { DType, TypedArray } from '../../dtype.ts';
import { encodeModel, OnnxType } from '../ort/onnx-graph.ts';
import { disableOrtTelemetry } from '../ort/telemetry.ts';

/**
 * onnxruntime-node's WebGPU execution provider (Dawn over Vulkan on Linux, Metal on macOS,
 * D3D12 on Windows), called synchronously through its native binding. Values stay on the GPU
 * between runs: every session puts its outputs there ('gpu-buffer'), and a GPU value is fed
 * back as an input of the next run. Host values move in and out through two one-node graphs
 * (an Identity whose output is on the GPU, one whose output is on the host): onnxruntime-node
 * 1.30 crashes the process on `getData()` of a GPU value, so nothing here calls it.
 */

/** A value onnxruntime holds on the GPU (an onnxruntime-common Tensor whose location is 'gpu-buffer'). */
export interface GpuValue {
  readonly dims: readonly number[];
  readonly type: string;
  readonly gpuBufferData: unknown;
  dispose(): void;
}

/** A graph loaded on the GPU: GPU values (or host ones, copied in) in, GPU values out. */
export interface GpuSession {
  run(feeds: Record<string, unknown>, outputs: readonly string[]): Record<string, GpuValue>;
}

interface NativeSession {
  loadModel(buffer: ArrayBuffer, offset: number, length: number, options: object): void;
  dispose(): void;
  run(feeds: Record<string, unknown>, fetches: Record<string, null>, options: object): Record<string, GpuValue & { data?: TypedArray }>;
}

type TensorCtor = new (...args: unknown[]) => GpuValue & { data: TypedArray };

export interface WebGpuRuntime {
  readonly version: string;
  /** Loads a graph whose outputs stay on the GPU. */
  session(model: Uint8Array): GpuSession;
  /** A GPU copy of host values, shaped `dims`. */
  upload(data: TypedArray, dims: readonly number[]): GpuValue;
  /** The host values of a GPU value. */
  download(value: GpuValue): TypedArray;
  /** The same GPU buffer seen with other dims (same element count): no copy. */
  view(value: GpuValue, dims: readonly number[]): GpuValue;
}

/** Where Debian's Chromium keeps SwiftShader, a Vulkan GPU in software: what tests run on without a GPU. */
export const SWIFTSHADER = { icd: '/usr/lib/chromium/vk_swiftshader_icd.json', lib: '/usr/lib/chromium' } as const;

const TYPE_NAMES: Readonly<Record<DType, string>> = { float32: 'float32', float64: 'float64', int32: 'int32' };

let loaded: WebGpuRuntime | undefined;

/**
 * The runtime, opened once per process: throws BackendUnavailableError, saying what to
 * install or set, where onnxruntime has no WebGPU provider here or Vulkan finds no adapter.
 */
export function loadWebGpuRuntime(): WebGpuRuntime {
  if (loaded === undefined) loaded = open();
  return loaded;
}

function open(): WebGpuRuntime {
  const require = createRequire(import.meta.url);
  let binding: { InferenceSession: new () => NativeSession; listSupportedBackends?: () => { name: string }[] };
  let Tensor: TensorCtor;
  let version: string;
  try {
    ({ binding } = require('onnxruntime-node/dist/binding.js'));
    const { initOrt } = require('onnxruntime-node/dist/binding.js') as { initOrt: () => void };
    ({ Tensor } = require('onnxruntime-common') as { Tensor: TensorCtor });
    ({ version } = require('onnxruntime-node/package.json') as { version: string });
    disableOrtTelemetry();
    initOrt();
  } catch (cause) {
    throw new BackendUnavailableError('onnxruntime-node could not be loaded on this machine; use the js backend', { cause });
  }
  const backends = binding.listSupportedBackends?.() ?? [];
  if (!backends.some((b) => b.name === 'webgpu')) {
    throw new BackendUnavailableError(`this build of onnxruntime-node ${version} has no WebGPU provider on ${process.platform}-${process.arch}`);
  }
  const sessions: NativeSession[] = [];
  const values = new Set<GpuValue>();
  // onnxruntime-node releases its environment in a hook of Node's teardown; sessions and GPU values still alive then
  // are released after it, in no set order, which sometimes crashed the process on its way out (SIGSEGV after the
  // last test): release them first, when the process says it exits
  process.once('exit', () => {
    try {
      for (const v of [...values]) v.dispose();
      for (const s of sessions.splice(0)) s.dispose();
    } catch {
      // the process is ending: what could not be released goes with it
    }
  });
  /** A GPU value onnxruntime made, disposed once (by its tensor's storage, or at exit). */
  const track = (v: GpuValue): GpuValue => {
    values.add(v);
    const dispose = v.dispose.bind(v);
    (v as { dispose: () => void }).dispose = () => {
      if (values.delete(v)) dispose();
    };
    return v;
  };
  const load = (model: Uint8Array, location: 'gpu-buffer' | 'cpu'): NativeSession => {
    const s = new binding.InferenceSession();
    s.loadModel(model.buffer as ArrayBuffer, model.byteOffset, model.byteLength, {
      executionProviders: [{ name: 'webgpu' }],
      preferredOutputLocation: location,
      graphOptimizationLevel: 'all',
      executionMode: 'sequential',
      // warnings (which nodes onnxruntime keeps on the CPU: shape arithmetic) are not the user's to act on
      logSeverityLevel: 3,
    });
    sessions.push(s);
    return s;
  };
  const identity = (type: number) =>
    encodeModel([{ op: 'Identity', inputs: ['x'], outputs: ['y'] }], [{ name: 'x', type, shape: null }], [{ name: 'y', type, shape: null }]);
  const movers = new Map<string, { up: NativeSession; down: NativeSession }>();
  const mover = (type: string) => {
    let m = movers.get(type);
    if (m === undefined) {
      const model = identity(type === 'int32' ? OnnxType.int32 : OnnxType.float32);
      m = { up: load(model, 'gpu-buffer'), down: load(model, 'cpu') };
      movers.set(type, m);
    }
    return m;
  };
  try {
    mover('float32');
  } catch (cause) {
    const hint = existsSync(SWIFTSHADER.icd)
      ? `; without a GPU, SwiftShader (Debian's chromium-common) is one: VK_ICD_FILENAMES=${SWIFTSHADER.icd} LD_LIBRARY_PATH=${SWIFTSHADER.lib}`
      : '; install a Vulkan driver and loader (libvulkan1 with mesa-vulkan-drivers or the GPU vendor\'s)';
    throw new BackendUnavailableError(`WebGPU found no GPU adapter on this machine${hint}`, { cause });
  }
  return {
    version,
    session(model) {
      const s = load(model, 'gpu-buffer');
      return {
        run(feeds, outputs) {
          const out = s.run(feeds, Object.fromEntries(outputs.map((n) => [n, null])), {});
          for (const n of outputs) track(out[n]);
          return out;
        },
      };
    },
    upload(data, dims) {
      const type = data instanceof Int32Array ? 'int32' : 'float32';
      return track(mover(type).up.run({ x: new Tensor(type, data, [...dims]) }, { y: null }, {}).y);
    },
    download(value) {
      return mover(value.type).down.run({ x: value }, { y: null }, {}).y.data!;
    },
    view(value, dims) {
      if (value.dims.length === dims.length && value.dims.every((d, i) => d === dims[i])) return value;
      return new Tensor({ location: 'gpu-buffer', gpuBuffer: value.gpuBufferData, type: value.type, dims: [...dims] });
    },
  };
}

/** The onnxruntime type name of an engine dtype (float64 has none on the GPU). */
export function gpuTypeOf(dtype: DType): string {
  return TYPE_NAMES[dtype];
}
