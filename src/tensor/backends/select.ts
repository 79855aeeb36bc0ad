import { BackendUnavailableError, InvalidArgumentError } from '../../errors.ts';
import type { Backend } from './backend.ts';
import { jsBackend } from './js.ts';
import { createOrtBackend, type OrtBackendOptions } from './ort.ts';

/**
 * The backend the engine dispatches heavy kernels to. The default is `ort` where
 * onnxruntime loads and `js` elsewhere; code that needs bitwise reproducibility
 * (tests, proofs) selects `js` explicitly.
 */
let current: Backend | null = null;

export type BackendName = 'js' | 'ort';

function defaultBackend(): Backend {
  try {
    return createOrtBackend();
  } catch (err) {
    if (err instanceof BackendUnavailableError) return jsBackend;
    throw err;
  }
}

export function getBackend(): Backend {
  current ??= defaultBackend();
  return current;
}

/**
 * Selects the backend by name (or a ready instance) and returns it.
 * @example
 * setBackend('js')                      // bitwise reproducible
 * setBackend('ort', { threads: 2 })     // fast, tolerances apply
 */
export function setBackend(backend: BackendName | Backend, options: OrtBackendOptions = {}): Backend {
  if (typeof backend !== 'string') current = backend;
  else if (backend === 'js') current = jsBackend;
  else if (backend === 'ort') current = createOrtBackend(options);
  else throw new InvalidArgumentError(`unknown backend '${backend}' (use 'js' or 'ort')`);
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
