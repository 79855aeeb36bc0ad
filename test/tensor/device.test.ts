import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  type Allocator,
  backendNames,
  backendTolerance,
  type Backend,
  createBackend,
  deviceOf,
  DeviceStorage,
  type DType,
  jsBackend,
  loadBackend,
  ORT_BACKEND_TOLERANCE,
  registerBackend,
  setBackend,
  Tensor,
  tensor,
  trace,
  type TypedArray,
  withBackend,
} from '../../src/tensor/index.ts';
import { ORT_TOLERANCES } from '../../src/verify/index.ts';
import { WEBGPU_TOLERANCE } from '../../src/tensor/backends/webgpu/backend.ts';

/**
 * A device backend made for this test: host memory behind an opaque handle (a number), an
 * allocator that counts every copy, and one kernel ('add'), so that the engine's side of a
 * device can be checked without a GPU.
 */
class CountingMemory implements Allocator<number> {
  readonly buffers = new Map<number, TypedArray>();
  copyins = 0;
  copyouts = 0;
  frees = 0;
  private next = 1;

  alloc(dtype: DType, length: number): number {
    const handle = this.next++;
    this.buffers.set(handle, dtype === 'int32' ? new Int32Array(length) : dtype === 'float64' ? new Float64Array(length) : new Float32Array(length));
    return handle;
  }

  copyin(handle: number, src: TypedArray): void {
    this.copyins++;
    this.buffers.get(handle)!.set(src);
  }

  async copyout(handle: number, dst: TypedArray): Promise<void> {
    this.copyouts++;
    await Promise.resolve();
    dst.set(this.buffers.get(handle)!);
  }

  free(handle: number): void {
    this.frees++;
    this.buffers.delete(handle);
  }
}

const DEVICE = 'counting-device';
const memory = new CountingMemory();
/** Its kernels read and write the buffers behind the handles, never host tensors. */
const counting: Backend = {
  name: DEVICE,
  deterministic: true,
  device: DEVICE,
  allocator: memory,
  matmul() {
    throw new Error('not a host backend');
  },
  runOp(op: string, args: readonly unknown[]): unknown {
    if (op !== 'add') return undefined;
    const [a, b] = args as [Tensor, Tensor];
    if (b.shape.join() !== a.shape.join()) return undefined;
    const x = memory.buffers.get(a.deviceStorage!.handle as number)!;
    const y = memory.buffers.get(b.deviceStorage!.handle as number)!;
    const out = a.deviceStorage!.backend.allocator.alloc(a.dtype, a.size) as number;
    const z = memory.buffers.get(out)!;
    for (let i = 0; i < z.length; i++) z[i] = x[i] + y[i];
    return storageTensor(a, out);
  },
};

/** A tensor over a handle this backend made (as a real backend's kernel would return). */
function storageTensor(like: Tensor, handle: number): Tensor {
  return new Tensor(new DeviceStorage(like.deviceStorage!.backend, handle, like.dtype, like.size), like.shape);
}

registerBackend(DEVICE, () => counting);

describe('tensors on a device', () => {
  setBackend('js');

  test('to(device) and toHost() round trip, one copy each way', async () => {
    const before = [memory.copyins, memory.copyouts];
    const x = tensor([[1, 2, 3], [4, 5, 6]]);
    assert.equal(x.device, 'cpu');
    const d = x.to(DEVICE);
    assert.equal(d.device, DEVICE);
    assert.deepEqual(d.shape, [2, 3]);
    assert.equal(d.dtype, 'float32');
    assert.equal(d.size, 6);
    assert.equal(d.to(DEVICE), d, 'already there: no copy');
    assert.deepEqual([memory.copyins - before[0], memory.copyouts - before[1]], [1, 0]);
    const back = await d.toHost();
    assert.equal(back.device, 'cpu');
    assert.deepEqual(back.toArray(), [1, 2, 3, 4, 5, 6]);
    assert.deepEqual(Array.from(await d.read()), [1, 2, 3, 4, 5, 6]);
    assert.deepEqual([memory.copyins - before[0], memory.copyouts - before[1]], [1, 2]);
    assert.equal(await x.toHost(), x, 'a host tensor is its own host copy');
    assert.equal(await x.read(), x.data, 'reading a host tensor copies nothing');
    const ids = tensor([7, 8], [2], 'int32').to(DEVICE);
    assert.equal(ids.dtype, 'int32');
    assert.deepEqual(Array.from(await ids.read()), [7, 8]);
  });

  test('reading a device tensor on the host is a typed error that says what to call', () => {
    const d = tensor([1, 2]).to(DEVICE);
    assert.throws(() => d.data, (err: Error) => err.name === 'DeviceDataError' && /await t\.read\(\)/.test(err.message));
    assert.throws(() => d.item(), { name: 'ShapeMismatchError' });
    assert.throws(() => tensor([1]).to(DEVICE).item(), { name: 'DeviceDataError' });
    assert.throws(() => d.toArray(), { name: 'DeviceDataError' });
    assert.throws(() => d.to('cpu'), { name: 'DeviceDataError' });
    assert.match(String(d), /on counting-device/);
  });

  test('ops refuse tensors on different devices, and ops without a device kernel', () => {
    const before = [memory.copyins, memory.copyouts];
    const host = tensor([1, 2]);
    const d = tensor([3, 4]).to(DEVICE);
    const copies = memory.copyins - before[0];
    assert.throws(() => d.add(host), { name: 'DeviceMismatchError' });
    assert.throws(() => host.mul(d), { name: 'DeviceMismatchError' });
    assert.throws(
      () => d.matmul(d.reshape([2, 1])),
      (err: Error & { details?: Record<string, unknown> }) => err.name === 'DeviceOpUnsupportedError' && err.details?.device === DEVICE,
    );
    assert.throws(
      () => d.exp(),
      (err: Error & { details?: Record<string, unknown> }) => err.name === 'DeviceOpUnsupportedError' && err.details?.op === 'exp',
    );
    assert.deepEqual([memory.copyins - before[0] - copies, memory.copyouts - before[1]], [0, 0], 'no silent copy');
    // host ops still run on the host while device tensors exist
    assert.deepEqual(host.mul(host).toArray(), [1, 4]);
  });

  test('an op with a device kernel runs there, copying nothing', async () => {
    const a = tensor([1, 2, 3]).to(DEVICE);
    const b = tensor([10, 20, 30]).to(DEVICE);
    const before = [memory.copyins, memory.copyouts];
    const c = a.add(b);
    assert.equal(c.device, DEVICE);
    const detached = c.detach();
    assert.equal(detached.device, DEVICE);
    assert.deepEqual([memory.copyins - before[0], memory.copyouts - before[1]], [0, 0]);
    assert.deepEqual(Array.from(await detached.read()), [11, 22, 33]);
    const frees = memory.frees;
    c.dispose();
    c.dispose();
    assert.equal(memory.frees, frees + 1);
  });

  test('a traced step replays on the device of its inputs', async () => {
    const a = tensor([1, 2]).to(DEVICE);
    const { step } = trace((x: Tensor, y: Tensor) => x.add(y).add(y), [a, a.add(a)]);
    assert.deepEqual(step.ops.map((o) => o.op), ['add', 'add']);
    const before = [memory.copyins, memory.copyouts];
    const out = step.run([tensor([5, 6]).to(DEVICE), tensor([1, 1]).to(DEVICE)]);
    assert.equal(out.device, DEVICE);
    assert.deepEqual(Array.from(await out.read()), [7, 8]);
    assert.deepEqual([memory.copyins - before[0], memory.copyouts - before[1]], [2, 1], 'the two inputs in, the result out');
  });

  test('a set of tensors (a model\'s parameters) knows its one device', () => {
    const host = [tensor([1]), tensor([2])];
    assert.equal(deviceOf(host), 'cpu');
    assert.equal(deviceOf([]), 'cpu');
    assert.equal(deviceOf(host.map((t) => t.to(DEVICE))), DEVICE);
    assert.throws(() => deviceOf([host[0], host[1].to(DEVICE)]), { name: 'DeviceMismatchError' });
  });

  test('dtype conversions keep working beside device moves', () => {
    const x = tensor([1.7, -2.2]);
    assert.deepEqual(x.to('int32').toArray(), [1, -2]);
    assert.equal(x.to('float64').dtype, 'float64');
    assert.equal(x.to('float32'), x);
  });
});

describe('the backend registry', () => {
  test('js and ort are registered, beside the backends a program adds', () => {
    const names = backendNames();
    assert.deepEqual(names.slice(0, 2), ['js', 'ort']);
    assert.ok(names.includes(DEVICE));
    assert.equal(loadBackend('js'), jsBackend);
    assert.equal(createBackend('js'), jsBackend);
    assert.equal(loadBackend(DEVICE), counting);
  });

  test('unknown names are a typed error listing the registered ones', () => {
    assert.throws(() => loadBackend('cuda'), (err: Error) => err.name === 'InvalidArgumentError' && /js, ort/.test(err.message));
    assert.throws(() => tensor([1]).to('cuda'), { name: 'InvalidArgumentError' });
    assert.throws(() => registerBackend('js', () => jsBackend), { name: 'InvalidArgumentError' });
  });

  test('the CPU context takes host backends only; a device backend keeps its own tensors', () => {
    assert.throws(() => setBackend(DEVICE), { name: 'InvalidArgumentError' });
    assert.throws(() => withBackend(counting, () => 0), { name: 'InvalidArgumentError' });
    assert.throws(() => tensor([1]).to('js'), { name: 'InvalidArgumentError' });
    // a host tensor computes in the CPU context while a device tensor lives beside it
    const d = tensor([1, 2]).to(DEVICE);
    assert.deepEqual(withBackend('js', () => tensor([1, 2]).add(tensor([3, 4]))).toArray(), [4, 6]);
    assert.equal(d.device, DEVICE);
  });

  test('each backend states its device and tolerance', () => {
    const exact = { f32: 0, bf16: 0, int8: 0, int4: 0 };
    assert.deepEqual(backendTolerance('js'), exact);
    assert.deepEqual(backendTolerance(counting), exact);
    // ort states the tolerances verification holds its results to
    assert.deepEqual(ORT_BACKEND_TOLERANCE, ORT_TOLERANCES);
    // webgpu's records are re-run on a validator's CPU and compared at the same tolerances
    assert.deepEqual(WEBGPU_TOLERANCE, ORT_TOLERANCES);
    assert.equal(jsBackend.device, 'cpu');
    const nondeterministic: Backend = { ...jsBackend, name: 'loose', deterministic: false, tolerance: undefined };
    assert.throws(() => backendTolerance(nondeterministic), { name: 'InvalidArgumentError' });
  });
});
