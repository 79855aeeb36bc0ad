import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DctTopkCodec, decodeHop, encodeHop, receivedAs } from '../../src/compress/index.ts';
import { randn, tensor } from '../../src/tensor/index.ts';

test('a hop in fp16 or int8 is one frame, decodes to exactly what the sender computed as received, and costs 2 or 1 + 4/row bytes a value', () => {
  const x = randn([3, 5, 24], { seed: 1 });
  for (const codec of ['fp16', 'int8'] as const) {
    const part = encodeHop(x, codec);
    const y = decodeHop(part);
    assert.deepEqual(y.shape, x.shape);
    assert.deepEqual(y.data, receivedAs(x, codec).data);
    assert.equal(part.bytes.length, codec === 'fp16' ? 2 * x.size : x.size + 4 * 15);
    const worst = Math.max(...x.data.map((v, i) => Math.abs(v - y.data[i])));
    assert.ok(worst < (codec === 'fp16' ? 4e-3 : 0.02), `${codec}: ${worst}`);
  }
});

test('a malformed int8 hop is an InvalidMessageError, never a crash', () => {
  const part = encodeHop(randn([2, 8], { seed: 2 }), 'int8');
  const bad = [
    { ...part, bytes: part.bytes.subarray(1) },
    { ...part, shape: [2, 3] },
    { ...part, shape: [] },
    { ...part, dtype: 'int32' as 'int8' },
  ];
  for (const b of bad) assert.throws(() => decodeHop(b), (e: Error) => e.name === 'InvalidMessageError');
});

test('DCT top-k codec: k per 64×64 block, in proportion for smaller blocks; a holder decodes another\'s bytes to exactly its own decoded copy', () => {
  const codec = new DctTopkCodec({ k: 32, chunk: 64, bits: 8 });
  assert.equal(codec.kFor([128, 384]), 32);
  assert.equal(codec.kFor([384]), 1); // blocks of 1 × 64: 32 × 64 / 4096 = 0.5 → at least 1
  assert.equal(codec.kFor([8, 8]), 1);
  const g = tensor(randn([128, 192], { seed: 3 }).data, [128, 192]);
  const { bytes, own } = codec.encode('w', g);
  const other = new DctTopkCodec({ k: 32, chunk: 64, bits: 8 });
  assert.deepEqual(other.decode('w', bytes, [128, 192]).data, own.data);
  assert.ok(4 * g.size / bytes.length > 100, `${4 * g.size / bytes.length}× fewer bytes`);
  assert.throws(() => other.decode('w', bytes, [192, 128]), (e: Error) => e.name === 'InvalidMessageError');
});

test('DCT top-k error feedback survives a failed step: after a rollback the retry sends what an undisturbed run sends', () => {
  const steps = [1, 2, 3].map((seed) => randn([64, 128], { seed }));
  const undisturbed = new DctTopkCodec({ k: 8 });
  const retried = new DctTopkCodec({ k: 8 });
  for (const [i, g] of steps.entries()) {
    const want = undisturbed.encode('w', g).bytes;
    undisturbed.commit();
    if (i === 1) {
      retried.encode('w', randn([64, 128], { seed: 99 })); // the attempt that failed
      retried.rollback();
    }
    assert.deepEqual(retried.encode('w', g).bytes, want);
    retried.commit();
  }
});
