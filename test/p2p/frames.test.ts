import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { InvalidMessageError } from '../../src/errors.ts';
import { decodeFrame, encodeControl, encodeTensor, FrameReader, fromWire, type WireTensor } from '../../src/p2p/index.ts';
import { Generator } from '../../src/tensor/index.ts';
import { concat } from '../helpers/bytes.ts';

describe('frames', () => {
  test('a tensor received inside a Node Buffer becomes a tensor of exactly its own bytes', () => {
    // sockets deliver Buffers, and Buffer.slice is a view of the whole pool slab, not a copy
    const slab = Buffer.alloc(8192, 0xff);
    const values = new Float64Array([1.5, -2.25, 3]);
    slab.set(new Uint8Array(values.buffer), 13);
    const t = fromWire({ requestId: 1, dtype: 'float64', shape: [3], bytes: slab.subarray(13, 37) });
    assert.deepEqual([...t.data], [1.5, -2.25, 3]);
    assert.equal(t.data.buffer.byteLength, 24);
  });

  test('control and tensor frames round-trip through arbitrary chunking', () => {
    const tensor: WireTensor = { requestId: 7, dtype: 'float32', shape: [3, 5], bytes: new Uint8Array(60).map((_, i) => i) };
    const wire = concat([encodeControl({ type: 'hello', n: 1 }), ...encodeTensor(tensor), encodeControl([1, 'two'])]);
    for (const size of [1, 3, 7, 64, wire.length]) {
      const reader = new FrameReader();
      const bodies: Uint8Array[] = [];
      for (let o = 0; o < wire.length; o += size) bodies.push(...reader.push(wire.subarray(o, o + size)));
      const frames = bodies.map(decodeFrame);
      assert.deepEqual(frames[0], { kind: 'control', message: { type: 'hello', n: 1 } });
      assert.equal(frames[1].kind, 'tensor');
      if (frames[1].kind === 'tensor') {
        assert.deepEqual(frames[1].tensor.shape, [3, 5]);
        assert.deepEqual([...frames[1].tensor.bytes], [...tensor.bytes]);
      }
      assert.deepEqual(frames[2], { kind: 'control', message: [1, 'two'] });
    }
  });

  test('10,000 malformed or truncated frames only ever raise InvalidMessageError', () => {
    const rng = new Generator(42);
    const valid = [
      encodeControl({ type: 'status' }),
      concat(encodeTensor({ requestId: 1, dtype: 'int32', shape: [2, 2], bytes: new Uint8Array(16) })),
    ];
    let rejected = 0;
    for (let i = 0; i < 10_000; i++) {
      const base = valid[i % valid.length];
      let bytes: Uint8Array;
      const mode = i % 4;
      if (mode === 0) bytes = base.subarray(0, rng.int(base.length)); // truncated
      else if (mode === 1) {
        bytes = base.slice();
        for (let k = 0; k < 3; k++) bytes[rng.int(bytes.length)] = rng.int(256); // flipped bytes
      } else if (mode === 2) bytes = Uint8Array.from({ length: 1 + rng.int(40) }, () => rng.int(256)); // noise
      else {
        bytes = base.slice();
        new DataView(bytes.buffer).setUint32(0, rng.nextUint32(), true); // lying length
      }
      const reader = new FrameReader(1 << 20);
      try {
        for (const body of reader.push(bytes)) decodeFrame(body);
      } catch (err) {
        assert.ok(err instanceof InvalidMessageError, `frame ${i}: ${(err as Error).name}`);
        rejected++;
      }
    }
    assert.ok(rejected > 1000);
  });
});
