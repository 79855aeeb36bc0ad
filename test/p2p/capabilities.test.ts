// What a worker announces about its machine is parsed with limits (src/p2p/vocabulary.ts): a GPU worker's device (its
// adapter's name, the bandwidth measured there) is taken as given when well formed, and a malformed one is a typed
// error that names the field, never a stack trace in the validator.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseCapabilities } from '../../src/p2p/index.ts';

const base = { memoryBytes: 2 ** 30, gflops: 120, tier: 'C', cores: 8, backend: 'webgpu' };

test('a GPU worker\'s device is read as announced; a CPU worker has none', () => {
  const device = { adapter: 'NVIDIA H100 80GB HBM3', bandwidthGBs: 2900 };
  assert.deepEqual(parseCapabilities({ ...base, device }).device, device);
  assert.equal(parseCapabilities({ ...base, backend: 'ort' }).device, undefined);
});

test('a malformed device is a typed error naming the field', () => {
  for (const [device, field] of [
    [{ adapter: 'x'.repeat(129), bandwidthGBs: 1 }, /capabilities\.device\.adapter/],
    [{ adapter: 7, bandwidthGBs: 1 }, /capabilities\.device\.adapter/],
    [{ adapter: 'gpu', bandwidthGBs: -1 }, /capabilities\.device\.bandwidthGBs/],
    [{ adapter: 'gpu' }, /capabilities\.device\.bandwidthGBs/],
    ['a string', /capabilities\.device/],
  ] as const) {
    assert.throws(() => parseCapabilities({ ...base, device }), (err: Error) => err.name !== 'TypeError' && field.test(err.message));
  }
});
