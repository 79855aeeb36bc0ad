// The compact weight formats (src/tensor/quant/): packing against brute force written from llama.cpp's reference
// quantizers (Q8_0, Q4_0), and the js kernels against the dense products of the unpacked matrices, bit for bit.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { floatToHalf, halfToFloat } from '../../src/tensor/dtype.ts';
import {
  embedding, formatBytes, linear, packedBytes, packedFromBytes, packedTensor, packedToBytes, packMatrix,
  packWeight, randn, setBackend, tensor, unpackMatrix,
  type WeightFormat,
} from '../../src/tensor/index.ts';

const f32 = Math.fround;
const half = (x: number) => halfToFloat(floatToHalf(x));
/** Values, with −0 as 0 (a zero weight's sign is its scale's). */
const plain = (a: Float32Array) => Array.from(a, (v) => v + 0);

/** llama.cpp's quantize_row_q8_0_ref and quantize_row_q4_0_ref, dequantized, one block of 32 at a time. */
function bruteForce(values: Float32Array, cols: number, format: 'int8' | 'int4'): Float32Array {
  const out = new Float32Array(values.length);
  for (let r = 0; r < values.length / cols; r++) {
    for (let b = 0; b < cols; b += 32) {
      const block = Array.from(values.subarray(r * cols + b, r * cols + Math.min(cols, b + 32)));
      if (format === 'int8') {
        const d = f32(Math.max(...block.map(Math.abs)) / 127);
        const id = d ? f32(1 / d) : 0;
        block.forEach((v, j) => {
          const x = f32(v * id);
          out[r * cols + b + j] = ((x < 0 ? -Math.round(-x) : Math.round(x)) * half(d));
        });
      } else {
        let amax = 0;
        let max = 0;
        for (const v of block) if (Math.abs(v) > amax) [amax, max] = [Math.abs(v), v];
        const d = f32(max / -8);
        const id = d ? f32(1 / d) : 0;
        block.forEach((v, j) => {
          out[r * cols + b + j] = ((Math.min(15, Math.trunc(f32(f32(v * id) + 8.5))) - 8) * half(d));
        });
      }
    }
  }
  return out;
}

describe('compact weights', () => {
  for (const format of ['int8', 'int4'] as const) {
    test(`${format}: packing equals llama.cpp's reference quantizer; a ragged last block is padded`, () => {
      for (const [rows, cols] of [[5, 64], [3, 40], [2, 7]]) {
        const w = randn([rows, cols], { seed: rows * cols }).data as Float32Array;
        w[3] = 0;
        const p = packMatrix(w, rows, cols, format);
        assert.deepEqual(plain(unpackMatrix(p)), plain(bruteForce(w, cols, format)), `[${rows}, ${cols}]`);
        assert.equal(packedBytes(p), formatBytes(format, rows, cols));
      }
      // a block of zeros stays zeros
      assert.deepEqual(plain(unpackMatrix(packMatrix(new Float32Array(64), 1, 64, format))), plain(new Float32Array(64)));
    });
  }

  test('bf16 keeps each weight rounded to bf16; int8 and int4 take 0.28 and 0.16 of the float32 bytes', () => {
    const w = randn([4, 64], { seed: 1 }).data as Float32Array;
    const back = unpackMatrix(packMatrix(w, 4, 64, 'bf16'));
    for (let i = 0; i < w.length; i++) assert.ok(Math.abs(back[i] - w[i]) <= Math.abs(w[i]) * 2 ** -8);
    assert.equal(formatBytes('int8', 4096, 4096) / formatBytes('f32', 4096, 4096), 0.28125);
    assert.equal(formatBytes('int4', 4096, 4096) / formatBytes('f32', 4096, 4096), 0.15625);
  });

  for (const format of ['bf16', 'int8', 'int4'] as WeightFormat[]) {
    test(`${format} on js: linear (both layouts), its input gradient and embedding equal the dense ops on the unpacked weights, bit for bit`, () => {
      setBackend('js');
      const x = randn([2, 3, 48], { seed: 2 });
      x.requiresGrad = true;
      const weight = randn([24, 48], { seed: 3 });
      const bias = randn([24], { seed: 4 });
      const packed = tensor(Float32Array.from(weight.data), [24, 48]);
      packWeight(packed, format);
      assert.equal(packed.requiresGrad, false);
      assert.equal(packed.size, 24 * 48);
      const dense = tensor(unpackMatrix(packed.packed!), [24, 48]);
      const y = linear(x, packed, bias);
      y.sum().backward();
      const gx = x.grad!.data.slice();
      x.grad = null;
      const yDense = linear(x, dense, bias);
      yDense.sum().backward();
      assert.deepEqual(y.data, yDense.data);
      assert.deepEqual(gx, x.grad!.data);
      // GPT-2's Conv1D: the weight stored [in, out]
      const inOut = tensor(Float32Array.from(randn([48, 24], { seed: 5 }).data), [48, 24]);
      packWeight(inOut, format);
      const inOutDense = tensor(unpackMatrix(inOut.packed!), [48, 24]);
      assert.deepEqual(linear(x, inOut, null, true).data, linear(x, inOutDense, null, true).data);
      const ids = tensor([5, 0, 23, 5], [2, 2], 'int32');
      assert.deepEqual(embedding(ids, packed).data, embedding(ids, dense).data);
      assert.throws(() => embedding(tensor([24], [1], 'int32'), packed), /outside the vocabulary of 24/);
    });
  }
});

describe('a packed matrix as bytes (how it travels and is addressed)', () => {
  for (const format of ['bf16', 'int8', 'int4'] as WeightFormat[]) {
    test(format, () => {
      const w = randn([5, 70], { seed: 3 });
      const p = packMatrix(w.data, 5, 70, format);
      const bytes = packedToBytes(p);
      assert.equal(bytes.byteLength, formatBytes(format, 5, 70));
      // from an unaligned copy too (a chunk inside a larger frame)
      const shifted = new Uint8Array(bytes.byteLength + 1);
      shifted.set(bytes, 1);
      for (const b of [bytes, shifted.subarray(1)]) {
        const back = packedFromBytes(format, 5, 70, b);
        assert.deepEqual(unpackMatrix(back), unpackMatrix(p));
        const t = packedTensor(back);
        assert.deepEqual(linear(tensor(Array.from({ length: 70 }, (_, i) => i / 70), [1, 70]), t).data,
          linear(tensor(Array.from({ length: 70 }, (_, i) => i / 70), [1, 70]), tensor(unpackMatrix(p), [5, 70])).data);
        assert.equal(t.requiresGrad, false);
      }
      assert.throws(() => packedFromBytes(format, 6, 70, bytes), /bytes, not/);
    });
  }
});
