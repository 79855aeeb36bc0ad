import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  ACTIVATION_CODECS,
  activationBytes,
  decodeActivation,
  type EncodedActivation,
  encodeActivation,
  parseActivationCodec,
  roundTrip,
} from '../../src/compress/index.ts';
import { Generator } from '../../src/tensor/index.ts';

function fp16(values: number[]): Float32Array {
  return roundTrip(Float32Array.from(values), [values.length], 'fp16');
}

function halfBits(v: number): number {
  const e = encodeActivation(Float32Array.of(v), [1], 'fp16');
  return new DataView(e.parts[0].buffer, e.parts[0].byteOffset).getUint16(0, true);
}

describe('activation codecs', () => {
  test('codec names parse; anything else is InvalidArgumentError', () => {
    for (const name of ACTIVATION_CODECS) assert.equal(parseActivationCodec(name), name);
    for (const bad of ['', 'FP16', 'bf16', 'int4', 'fp16 ', 'float32']) {
      assert.throws(() => parseActivationCodec(bad), { name: 'InvalidArgumentError' }, bad);
    }
  });

  test('fp16 is exact for every finite half, and keeps infinities, NaN and −0', () => {
    const halves: number[] = [];
    for (let h = 0; h < 65536; h++) {
      const exp = (h >> 10) & 0x1f;
      const magnitude = exp === 0 ? (h & 0x3ff) * 2 ** -24 : (1 + (h & 0x3ff) / 1024) * 2 ** (exp - 15);
      if (exp !== 31) halves.push(h & 0x8000 ? -magnitude : magnitude);
    }
    assert.deepEqual([...fp16(halves)], halves); // deepEqual tells −0 from 0
    const special = fp16([Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, Number.NaN, -0, 0]);
    assert.deepEqual([...special], [Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, Number.NaN, -0, 0]);
    assert.equal(halfBits(-0), 0x8000);
  });

  test('fp16 rounds to nearest, ties to even; overflows to ±Inf; subnormals round too', () => {
    const cases: [number, number][] = [
      [1 + 2 ** -11, 1], // halfway between 1 and 1 + 2^-10: the even mantissa (0)
      [1 + 3 * 2 ** -11, 1 + 2 ** -9], // halfway between mantissas 1 and 2: 2
      [1 + 2 ** -11 + 2 ** -20, 1 + 2 ** -10], // just above halfway: up
      [1 + 2 ** -11 - 2 ** -20, 1], // just below: down
      [-(1 + 3 * 2 ** -11), -(1 + 2 ** -9)],
      [65504, 65504], // the largest half
      [65519, 65504], // below the halfway point to 2^16
      [65520, Number.POSITIVE_INFINITY], // halfway, the even neighbour is 2^16: overflow
      [-1e6, Number.NEGATIVE_INFINITY],
      [2 ** -24, 2 ** -24], // the smallest subnormal
      [2 ** -25, 0], // halfway between 0 and 2^-24: the even one, 0
      [3 * 2 ** -26, 2 ** -24], // above halfway
      [1.5 * 2 ** -24, 2 * 2 ** -24], // halfway between subnormals 1 and 2: 2
      [2.5 * 2 ** -24, 2 * 2 ** -24], // halfway between 2 and 3: 2
      [1023 * 2 ** -24, 1023 * 2 ** -24], // the largest subnormal
      [2 ** -14, 2 ** -14], // the smallest normal
      [-1e-9, -0], // underflow keeps the sign
      [0.1, 0.0999755859375],
    ];
    const got = fp16(cases.map(([x]) => x));
    cases.forEach(([x, want], i) => assert.ok(Object.is(got[i], want), `${x} → ${got[i]}, want ${want}`));
  });

  test('int8: error per element ≤ scale / 2, zero rows stay zero, bytes = elements + 4 × rows', () => {
    const rng = new Generator(3);
    const shape = [2, 5, 33];
    const data = Float32Array.from({ length: 2 * 5 * 33 }, () => rng.normal() * 10);
    data.fill(0, 33, 66); // row 1 is all zeros
    const enc = encodeActivation(data, shape, 'int8');
    assert.equal(enc.parts[0].length + enc.parts[1].length, activationBytes(shape, 'int8'));
    assert.equal(activationBytes(shape, 'int8'), 330 + 4 * 10);
    const scales = new Float32Array(enc.parts[1].slice().buffer);
    assert.equal(scales[1], 0);
    const back = decodeActivation(enc);
    for (let r = 0; r < 10; r++) {
      let max = 0;
      for (let i = r * 33; i < (r + 1) * 33; i++) max = Math.max(max, Math.abs(data[i]));
      assert.ok(Math.abs(scales[r] - max / 127) <= 1e-7 * max);
      for (let i = r * 33; i < (r + 1) * 33; i++) {
        assert.ok(Math.abs(back[i] - data[i]) <= (scales[r] / 2) * (1 + 1e-6), `row ${r} element ${i}`);
      }
    }
    assert.ok(back.subarray(33, 66).every((v) => v === 0));
    assert.deepEqual(roundTrip(data, shape, 'int8'), back);
  });

  test('int8 rounds halves away from zero and uses the full ±127', () => {
    const enc = encodeActivation(Float32Array.of(127, -254, 1, -1, 3), [1, 5], 'int8'); // scale 2
    assert.deepEqual([...new Int8Array(enc.parts[0].buffer, enc.parts[0].byteOffset, 5)], [64, -127, 1, -1, 2]);
    assert.deepEqual([...decodeActivation(enc)], [128, -254, 2, -2, 4]);
  });

  test('sizes on the wire, and none is exact', () => {
    assert.equal(activationBytes([4, 16, 768], 'none'), 4 * 4 * 16 * 768);
    assert.equal(activationBytes([4, 16, 768], 'fp16'), 2 * 4 * 16 * 768);
    assert.equal(activationBytes([768], 'int8'), 768 + 4);
    assert.equal(activationBytes([], 'int8'), 1 + 4);
    for (const codec of ACTIVATION_CODECS) {
      const data = Float32Array.from({ length: 24 }, (_, i) => Math.sin(i) * 100);
      const enc = encodeActivation(data, [2, 3, 4], codec);
      assert.equal(enc.parts.reduce((n, p) => n + p.length, 0), activationBytes([2, 3, 4], codec));
      assert.deepEqual(decodeActivation(enc), roundTrip(data, [2, 3, 4], codec));
    }
    assert.deepEqual(roundTrip(Float32Array.of(1.1, -2.2), [2], 'none'), Float32Array.of(1.1, -2.2));
    assert.deepEqual(roundTrip(new Float32Array(0), [0, 8], 'int8'), new Float32Array(0));
  });

  test('parts received at any alignment decode the same', () => {
    const data = Float32Array.from({ length: 12 }, (_, i) => i - 5.5);
    for (const codec of ACTIVATION_CODECS) {
      const enc = encodeActivation(data, [3, 4], codec);
      const shifted = enc.parts.map((p) => {
        const slab = new Uint8Array(p.length + 1);
        slab.set(p, 1);
        return slab.subarray(1);
      });
      assert.deepEqual(decodeActivation({ ...enc, parts: shifted }), decodeActivation(enc));
    }
  });

  test('bad input to encode is InvalidArgumentError; bad messages to decode are InvalidMessageError', () => {
    assert.throws(() => encodeActivation(new Float32Array(5), [2, 3], 'fp16'), { name: 'InvalidArgumentError' });
    assert.throws(() => encodeActivation(new Float32Array(2), [2], 'bf16' as 'fp16'), { name: 'InvalidArgumentError' });
    assert.throws(() => encodeActivation(Float32Array.of(1, Number.NaN), [2], 'int8'), { name: 'InvalidArgumentError' });
    assert.throws(() => encodeActivation(Float32Array.of(Number.POSITIVE_INFINITY), [1], 'int8'), { name: 'InvalidArgumentError' });
    assert.throws(() => activationBytes([2, -1], 'none'), { name: 'InvalidArgumentError' });
    const good = encodeActivation(Float32Array.of(1, 2, 3, 4), [2, 2], 'int8');
    const bad: EncodedActivation[] = [
      { ...good, codec: 'int4' as 'int8' },
      { ...good, shape: [2, 3] },
      { ...good, shape: [2, 2.5] },
      { ...good, shape: [2 ** 20, 2 ** 20] },
      { ...good, shape: [1, 1, 1, 1, 1, 1, 1, 1, 4] },
      { ...good, parts: [good.parts[0]] },
      { ...good, parts: [good.parts[0], good.parts[1].subarray(1)] },
      { ...good, parts: [good.parts[0], good.parts[1], new Uint8Array(0)] },
      { ...good, parts: [Uint8Array.of(0x80, 0, 0, 0), good.parts[1]] }, // −128
      { ...good, parts: [good.parts[0], new Uint8Array(Float32Array.of(1, -1).buffer)] }, // negative scale
      { ...good, parts: [good.parts[0], new Uint8Array(Float32Array.of(1, Number.NaN).buffer)] },
      { codec: 'fp16', shape: [3], parts: [new Uint8Array(5)] },
      { codec: 'none', shape: [3], parts: [new Uint8Array(11)] },
      { codec: 'none', shape: [3], parts: [[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] as unknown as Uint8Array] },
    ];
    bad.forEach((b, i) => assert.throws(() => decodeActivation(b), { name: 'InvalidMessageError' }, `case ${i}`));
  });
});
