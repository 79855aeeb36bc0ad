import { readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type { Feed, OrtRuntime } from './runtime.ts';
import { disableOrtTelemetry } from './telemetry.ts';

/**
 * onnxruntime's C API called directly (through koffi, a prebuilt FFI), on the same
 * libonnxruntime that onnxruntime-node ships. The Node binding copies every output of
 * every run: onnxruntime allocates it, then it is copied into the caller's buffer, so a
 * training step of GPT-2 small touched ~1 GB of fresh pages per step (~0.8 s of 4.8 s at
 * one thread, measured with perf: page clearing and memcpy). Here inputs and outputs are
 * OrtValues over our own Float32Arrays: onnxruntime reads and writes them in place.
 */

/**
 * Indices into the OrtApi function table (onnxruntime_c_api.h). The table only ever grows
 * at its end, so the indices hold for every release that has them.
 */
const FN = {
  GetErrorMessage: 2,
  CreateEnv: 3,
  CreateSessionFromArray: 8,
  Run: 9,
  CreateSessionOptions: 10,
  SetSessionExecutionMode: 13,
  SetSessionGraphOptimizationLevel: 23,
  SetIntraOpNumThreads: 24,
  SetInterOpNumThreads: 25,
  CreateTensorWithDataAsOrtValue: 49,
  CreateCpuMemoryInfo: 69,
  ReleaseStatus: 93,
  ReleaseSession: 95,
  ReleaseValue: 96,
  ReleaseSessionOptions: 100,
  AddSessionConfigEntry: 130,
} as const;
/**
 * The API version asked for. Every release hands out the same table for any version it
 * supports, so this only sets the oldest library accepted (1.13, which has every index above).
 */
const API_VERSION = 13;
const FLOAT = 1;
const INT32 = 6;
const INT64 = 7;
const LOG_ERROR = 3;
const ENABLE_ALL = 99;

type Fn = (...args: unknown[]) => unknown;
interface Koffi {
  load(path: string): { func(signature: string): Fn };
  struct(name: string, fields: Record<string, string>): unknown;
  array(type: string, length: number): unknown;
  proto(signature: string): unknown;
  decode(pointer: unknown, type: unknown): unknown;
  call(pointer: unknown, type: unknown, ...args: unknown[]): unknown;
  address(pointer: unknown): bigint;
}

/** The shared library next to onnxruntime-node's binding for this platform, if there is one. */
function libraryPath(require: NodeJS.Require): string | null {
  const root = dirname(require.resolve('onnxruntime-node/package.json'));
  const dir = join(root, 'bin', 'napi-v6', process.platform, process.arch);
  let files: string[];
  try {
    files = readdirSync(dir);
  } catch {
    return null;
  }
  const wanted = process.platform === 'win32' ? /^onnxruntime\.dll$/ : /^libonnxruntime\.(so\.1|1\.dylib)$/;
  const name = files.find((f) => wanted.test(f));
  return name === undefined ? null : join(dir, name);
}

let loaded: OrtRuntime | null | undefined;
/** Library handles: koffi unloads a library when its handle is collected. */
const handles: unknown[] = [];

/** The C API through FFI, or null where koffi or the library cannot be loaded here. */
export function loadOrtFfi(): OrtRuntime | null {
  if (loaded !== undefined) return loaded;
  try {
    loaded = open();
  } catch {
    loaded = null;
  }
  return loaded;
}

function open(): OrtRuntime | null {
  const require = createRequire(import.meta.url);
  const path = libraryPath(require);
  if (path === null) return null;
  const koffi = require('koffi') as Koffi;
  const lib = koffi.load(path);
  handles.push(lib);
  const base = koffi.decode(lib.func('void *OrtGetApiBase(void)')(), koffi.struct('OrtApiBase', { GetApi: 'void *', GetVersionString: 'void *' })) as {
    GetApi: unknown;
    GetVersionString: unknown;
  };
  const version = koffi.call(base.GetVersionString, koffi.proto('const char *OrtGetVersionString(void)')) as string;
  const api = koffi.call(base.GetApi, koffi.proto('void *OrtGetApi(uint32_t version)'), API_VERSION);
  if (api === null) return null;
  const table = koffi.decode(api, koffi.array('void *', FN.AddSessionConfigEntry + 1)) as unknown[];
  const fn = (index: number, signature: string) => koffi.decode(table[index], koffi.proto(signature)) as Fn;
  const c = {
    errorMessage: fn(FN.GetErrorMessage, 'const char *OrtGetErrorMessage(void *status)'),
    createEnv: fn(FN.CreateEnv, 'void *OrtCreateEnv(int level, const char *id, _Out_ void **env)'),
    createSession: fn(
      FN.CreateSessionFromArray,
      'void *OrtCreateSessionFromArray(void *env, const void *data, size_t length, void *options, _Out_ void **session)',
    ),
    run: fn(
      FN.Run,
      'void *OrtRun(void *session, void *runOptions, const char **inputNames, void **inputs, size_t inputCount, '
      + 'const char **outputNames, size_t outputCount, _Inout_ void **outputs)',
    ),
    createOptions: fn(FN.CreateSessionOptions, 'void *OrtCreateSessionOptions(_Out_ void **options)'),
    setMode: fn(FN.SetSessionExecutionMode, 'void *OrtSetSessionExecutionMode(void *options, int mode)'),
    setLevel: fn(FN.SetSessionGraphOptimizationLevel, 'void *OrtSetGraphOptimizationLevel(void *options, int level)'),
    setIntra: fn(FN.SetIntraOpNumThreads, 'void *OrtSetIntraOpNumThreads(void *options, int threads)'),
    setInter: fn(FN.SetInterOpNumThreads, 'void *OrtSetInterOpNumThreads(void *options, int threads)'),
    createTensor: fn(
      FN.CreateTensorWithDataAsOrtValue,
      'void *OrtCreateTensorWithData(void *info, void *data, size_t bytes, const int64_t *shape, size_t rank, int type, _Out_ void **value)',
    ),
    createCpuInfo: fn(FN.CreateCpuMemoryInfo, 'void *OrtCreateCpuMemoryInfo(int allocator, int memType, _Out_ void **info)'),
    releaseStatus: fn(FN.ReleaseStatus, 'void OrtReleaseStatus(void *status)'),
    releaseValue: fn(FN.ReleaseValue, 'void OrtReleaseValue(void *value)'),
    releaseOptions: fn(FN.ReleaseSessionOptions, 'void OrtReleaseSessionOptions(void *options)'),
    releaseSession: fn(FN.ReleaseSession, 'void OrtReleaseSession(void *session)'),
    addConfig: fn(FN.AddSessionConfigEntry, 'void *OrtAddSessionConfigEntry(void *options, const char *key, const char *value)'),
  };
  const check = (status: unknown) => {
    if (status === null) return;
    const message = c.errorMessage(status) as string;
    c.releaseStatus(status);
    throw new Error(`onnxruntime: ${message}`);
  };
  const out: unknown[] = [null];
  const take = (status: unknown) => {
    check(status);
    return out[0];
  };
  disableOrtTelemetry();
  const env = take(c.createEnv(LOG_ERROR, 'tensorlink', out));
  const cpu = take(c.createCpuInfo(0, 0, out));

  /** Shapes as int64 arrays, kept: decoding asks for the same few thousands of times. */
  const shapes = new Map<string, BigInt64Array>();
  const shapeOf = (dims: readonly number[]) => {
    const key = dims.join(',');
    let shape = shapes.get(key);
    if (shape === undefined) {
      if (shapes.size > 1024) shapes.clear();
      shape = BigInt64Array.from(dims, (d) => BigInt(d));
      shapes.set(key, shape);
    }
    return shape;
  };
  const value = (feed: Feed) => {
    const shape = shapeOf(feed.dims);
    const type = feed.data instanceof Float32Array ? FLOAT : feed.data instanceof Int32Array ? INT32 : INT64;
    return take(c.createTensor(cpu, feed.data, feed.data.byteLength, shape, shape.length, type, out));
  };

  return {
    kind: 'ffi',
    version,
    session(model, threads, spinning) {
      const options = take(c.createOptions(out));
      let session: unknown;
      try {
        check(c.setMode(options, 0));
        check(c.setLevel(options, ENABLE_ALL));
        check(c.setIntra(options, threads));
        check(c.setInter(options, 1));
        check(c.addConfig(options, 'session.intra_op.allow_spinning', spinning ? '1' : '0'));
        session = take(c.createSession(env, model, model.byteLength, options, out));
      } finally {
        c.releaseOptions(options);
      }
      let released = false;
      return {
        release() {
          if (released) return;
          released = true;
          c.releaseSession(session);
        },
        run(inputs, outputs) {
          if (released) throw new Error('an onnxruntime session was run after its release');
          const values: unknown[] = [];
          try {
            for (const f of inputs) values.push(value(f));
            const outValues = outputs.map((f) => {
              const v = value(f);
              values.push(v);
              return v;
            });
            const written = [...outValues];
            check(c.run(session, null, inputs.map((f) => f.name), values.slice(0, inputs.length), inputs.length,
              outputs.map((f) => f.name), outputs.length, written));
            written.forEach((v, i) => {
              if (koffi.address(v) === koffi.address(outValues[i])) return;
              // onnxruntime may hand back its own value instead of filling ours; none of our graphs does.
              c.releaseValue(v);
              throw new Error(`onnxruntime did not write output '${outputs[i].name}' in place`);
            });
          } finally {
            for (const v of values) c.releaseValue(v);
          }
        },
      };
    },
  };
}
