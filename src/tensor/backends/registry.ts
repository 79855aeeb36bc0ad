import { InvalidArgumentError } from '../../errors.ts';
import { CPU, type Device } from '../device.ts';
import { type Backend, EXACT, type Tolerance } from './backend.ts';
import { jsBackend } from './js/backend.ts';
import { createOrtBackend, type OrtBackendOptions } from './ort/backend.ts';
import { createWebGpuBackend, type WebGpuBackendOptions } from './webgpu/backend.ts';

/**
 * Backends by name. A factory makes a backend on demand, so that registering one loads
 * nothing: `ort`'s loads onnxruntime the first time an ort backend is made, a device
 * backend's would open its device. Two backends can serve one process: the CPU context
 * (`setBackend`, select.ts) for host tensors, and every device backend for the tensors that
 * live on its device (a worker's section on 'webgpu' beside its validator's js re-run).
 */
export type BackendFactory = (options?: BackendOptions) => Backend;

/** Options for a backend's factory, its own kind (ort's: OrtBackendOptions). */
export type BackendOptions = object;

const factories = new Map<string, BackendFactory>();
/** The one instance per name that loadBackend shares (device tensors point at it). */
const shared = new Map<string, Backend>();

/**
 * Adds a backend under `name`. A device backend (one whose `device` is not 'cpu') must name
 * its device as it is registered, so that `t.to('webgpu')` finds the memory it owns.
 * @example
 * registerBackend('webgpu', (options) => createWebGpuBackend(options))
 * const x = tensor([1, 2, 3]).to('webgpu')
 */
export function registerBackend(name: string, factory: BackendFactory): void {
  if (factories.has(name)) throw new InvalidArgumentError(`a backend named '${name}' is already registered`);
  factories.set(name, factory);
}

/**
 * The registered backends' names, in the order they were registered.
 * @example
 * backendNames() // ['js', 'ort']
 */
export function backendNames(): string[] {
  return [...factories.keys()];
}

function factoryOf(name: string): BackendFactory {
  const factory = factories.get(name);
  if (factory === undefined) {
    throw new InvalidArgumentError(`unknown backend '${name}' (registered: ${backendNames().join(', ')})`);
  }
  return factory;
}

function checked(name: string, backend: Backend): Backend {
  const device = backend.device ?? CPU;
  if (device !== CPU && device !== name) {
    throw new InvalidArgumentError(`backend '${name}' says its device is '${device}': a device backend is registered under its device's name`);
  }
  return backend;
}

/**
 * A new backend of that name, made with `options` (ort: `{ threads }`). Unknown names are an
 * InvalidArgumentError that lists the registered ones; a backend that cannot load here is a
 * BackendUnavailableError.
 * @example
 * const ort = createBackend('ort', { threads: 2 })
 */
export function createBackend(name: string, options: BackendOptions = {}): Backend {
  return checked(name, factoryOf(name)(options));
}

/**
 * The process's shared backend of that name, made on first use with default options: the
 * one that owns the memory of a device's tensors.
 * @example
 * const gpu = loadBackend('webgpu') // the backend `t.to('webgpu')` moves into
 */
export function loadBackend(name: string): Backend {
  let backend = shared.get(name);
  if (backend === undefined) {
    backend = createBackend(name);
    shared.set(name, backend);
  }
  return backend;
}

/**
 * The device a backend computes on ('cpu' unless it says otherwise).
 * @example
 * backendDevice(getBackend()) // 'cpu'
 */
export function backendDevice(backend: Backend): Device {
  return backend.device ?? CPU;
}

/**
 * The tolerance a backend states against the js kernels (Backend.tolerance): what the
 * conformance suite holds it to. A deterministic backend that states none is held to EXACT.
 * @example
 * backendTolerance('js')  // { f32: 0, bf16: 0, int8: 0, int4: 0 }
 * backendTolerance('ort') // { f32: 3e-5, bf16: 3e-5, int8: 0.1, int4: 0.08 }
 */
export function backendTolerance(backend: string | Backend): Tolerance {
  const b = typeof backend === 'string' ? loadBackend(backend) : backend;
  if (b.tolerance !== undefined) return b.tolerance;
  if (b.deterministic) return EXACT;
  throw new InvalidArgumentError(`backend '${b.name}' is not deterministic and states no tolerance`);
}

registerBackend('js', () => jsBackend);
registerBackend('ort', (options) => createOrtBackend(options as OrtBackendOptions));
registerBackend('webgpu', (options) => createWebGpuBackend(options as WebGpuBackendOptions));
