import { BackendUnavailableError, InvalidArgumentError } from '../../errors.ts';
import type { Backend } from './backend.ts';
import type { OrtBackendOptions } from './ort/backend.ts';
import { CPU, type Device } from '../device.ts';
import { backendDevice, createBackend, loadBackend } from './registry.ts';

/**
 * The CPU context: the host backend that ops on host tensors hand their heavy kernels to.
 * The default is `ort` where onnxruntime loads and `js` elsewhere; code that needs bitwise
 * reproducibility (tests, proofs) selects `js` explicitly. Tensors on a device run on the
 * backend that owns their memory instead (see registry.ts), whatever is selected here.
 */
let current: Backend | null = null;

/** A registered backend's name: 'js' and 'ort' are always there (registry.ts). */
export type BackendName = 'js' | 'ort' | (string & {});

function defaultBackend(): Backend {
  try {
    return createBackend('ort');
  } catch (err) {
    if (err instanceof BackendUnavailableError) return loadBackend('js');
    throw err;
  }
}

export function getBackend(): Backend {
  current ??= defaultBackend();
  return current;
}

function hostBackend(backend: BackendName | Backend, options: OrtBackendOptions): Backend {
  const b = typeof backend === 'string' ? createBackend(backend, options) : backend;
  const device = backendDevice(b);
  if (device !== 'cpu') {
    throw new InvalidArgumentError(
      `backend '${b.name}' computes on device '${device}', not in the CPU context: move tensors there with t.to('${device}')`,
    );
  }
  return b;
}

/**
 * Selects the CPU context's backend by name (or a ready instance) and returns it.
 * @example
 * setBackend('js')                      // bitwise reproducible
 * setBackend('ort', { threads: 2 })     // fast, tolerances apply
 */
export function setBackend(backend: BackendName | Backend, options: OrtBackendOptions = {}): Backend {
  current = hostBackend(backend, options);
  return current;
}

/** Runs `fn` with another backend selected, restoring the previous one after. */
export function withBackend<T>(backend: BackendName | Backend, fn: () => T): T {
  const previous = current;
  setBackend(backend);
  try {
    return fn();
  } finally {
    current = previous;
  }
}

let device: Device = CPU;

/**
 * Chooses where a node runs its model's steps: 'cpu' (the CPU context above, the default) or a
 * device backend's name ('webgpu'), which is opened now so that a missing adapter is a
 * BackendUnavailableError at start, with what to install. Host work (the ends, tokenizing,
 * sampling, re-running records) stays on the CPU context.
 * @example
 * setComputeDevice('webgpu') // a worker's sections run as graphs on the GPU
 */
export function setComputeDevice(next: Device): void {
  if (next !== CPU) {
    const b = loadBackend(next);
    if (backendDevice(b) !== next) throw new InvalidArgumentError(`backend '${next}' computes in host memory: select it with setBackend`);
  }
  device = next;
}

/** Where this node runs its model's steps (see setComputeDevice). */
export function computeDevice(): Device {
  return device;
}

/**
 * The name a node's work records give for how they were computed: the device backend's where
 * steps run on a device, else the CPU context's ('js', 'ort').
 * @example
 * computeName() // 'ort', or 'webgpu' on a GPU worker
 */
export function computeName(): string {
  return device === CPU ? getBackend().name : device;
}
