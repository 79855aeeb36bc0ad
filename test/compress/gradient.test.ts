import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  type CompressedGradient,
  compressedBytes,
  DCT_TOPK_DEFAULTS,
  decodeCompressed,
  decompressGradient,
  denseBytes,
  encodeCompressed,
  GradientCompressor,
  parseDctTopk,
} from '../../src/compress/index.ts';
import { Generator } from '../../src/tensor/index.ts';

function random(n: number, rng: Generator, scale = 1): Float32Array {
  return Float32Array.from({ length: n }, () => scale * rng.normal());
}

function bytesOf(a: Float32Array): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** Throws whatever decoding (and decompressing what decodes) throws; returns whether it decoded. */
function tryDecode(bytes: Uint8Array): boolean {
  try {
    decompressGradient(decodeCompressed(bytes));
    return true;
  } catch (err) {
    assert.equal((err as Error).name, 'InvalidMessageError', `${(err as Error).name}: ${(err as Error).message}`);
    return false;
  }
}

describe('dct-topk options', () => {
  test('the CLI form parses, keys left out take the defaults', () => {
    assert.deepEqual(parseDctTopk('dct-topk'), { k: 32, chunk: 64, bits: 8 });
    assert.deepEqual(DCT_TOPK_DEFAULTS, { k: 32, chunk: 64, bits: 8 });
    assert.deepEqual(parseDctTopk('dct-topk:k=64'), { k: 64, chunk: 64, bits: 8 });
    assert.deepEqual(parseDctTopk('dct-topk:bits=16,chunk=32,k=8'), { k: 8, chunk: 32, bits: 16 });
    assert.deepEqual(parseDctTopk('dct-topk:k=1,chunk=256,bits=32'), { k: 1, chunk: 256, bits: 32 });
  });

  test('each kind of bad form is InvalidArgumentError', () => {
    const bad = [
      '', 'dct', 'topk', 'dct-topk:', 'dct-topk:k', 'dct-topk:k=', 'dct-topk:k=0', 'dct-topk:k=-1', 'dct-topk:k=1.5', 'dct-topk:k=1e3',
      'dct-topk:k=65537', 'dct-topk:chunk=0', 'dct-topk:chunk=257', 'dct-topk:bits=4', 'dct-topk:bits=64', 'dct-topk:foo=1',
      'dct-topk:k=1,k=2', 'dct-topk:k=1,', 'dct-topk:k=1;chunk=8', ' dct-topk', 'DCT-TOPK',
    ];
    for (const text of bad) assert.throws(() => parseDctTopk(text), { name: 'InvalidArgumentError' }, text);
    for (const options of [{ k: 0 }, { chunk: 300 }, { bits: 12 as 8 }, { k: Number.NaN }]) {
      assert.throws(() => new GradientCompressor(options), { name: 'InvalidArgumentError' });
    }
  });
});

describe('gradient compression with error feedback', () => {
  test('sent + residual conserves the sum of the gradients (bits 32, 16 and 8)', () => {
    for (const bits of [32, 16, 8] as const) {
      const rng = new Generator(bits);
      const shape = [96, 40];
      const gc = new GradientCompressor({ k: 4, chunk: 8, bits });
      const sumG = new Float64Array(96 * 40);
      const sumSent = new Float64Array(96 * 40);
      for (let t = 0; t < 20; t++) {
        const g = random(96 * 40, rng);
        const sent = decompressGradient(gc.compress('w', g, shape));
        for (let i = 0; i < g.length; i++) {
          sumG[i] += g[i];
          sumSent[i] += sent[i];
        }
      }
      const residual = gc.residual('w')!;
      let err = 0;
      let scale = 0;
      for (let i = 0; i < sumG.length; i++) {
        err = Math.max(err, Math.abs(sumSent[i] + residual[i] - sumG[i]));
        scale = Math.max(scale, Math.abs(sumG[i]));
      }
      assert.ok(err < 1e-5 * scale, `bits ${bits}: max error ${err} of ${scale}`);
    }
  });

  test('a constant gradient is delivered on average: the residual stays bounded', () => {
    const rng = new Generator(9);
    const g = random(64 * 64, rng);
    const gc = new GradientCompressor({ k: 16, chunk: 16, bits: 8 });
    const sum = new Float64Array(g.length);
    const steps = 200;
    for (let t = 0; t < steps; t++) {
      const sent = decompressGradient(gc.compress('w', g, [64, 64]));
      for (let i = 0; i < g.length; i++) sum[i] += sent[i];
    }
    let err = 0;
    let norm = 0;
    for (let i = 0; i < g.length; i++) {
      err += (sum[i] / steps - g[i]) ** 2;
      norm += g[i] ** 2;
    }
    assert.ok(Math.sqrt(err / norm) < 0.1, `relative error of the mean ${Math.sqrt(err / norm)}`);
  });

  test('keeps k per block, and a k beyond the block sends everything exactly', () => {
    const rng = new Generator(2);
    const c = new GradientCompressor({ k: 3, chunk: 4, bits: 32 }).compress('w', random(8 * 6, rng), [8, 6]);
    assert.equal(c.k, 3);
    assert.equal(c.indices.length, 3 * (8 / 4) * (6 / 3));
    const g = random(7, rng);
    const gc = new GradientCompressor({ k: 100, chunk: 64, bits: 32 });
    const full = decompressGradient(gc.compress('b', g, [7]));
    for (let i = 0; i < 7; i++) assert.ok(Math.abs(full[i] - g[i]) < 1e-6);
    assert.ok(gc.residual('b')!.every((r) => Math.abs(r) < 1e-6));
    gc.reset();
    assert.equal(gc.residual('b'), undefined);
  });

  test('identical inputs give identical bytes; decoded and original decompress bit for bit', () => {
    const rng = new Generator(4);
    const grads = [random(3 * 5 * 64, rng), random(3 * 5 * 64, rng)];
    for (const bits of [32, 16, 8] as const) {
      const a = new GradientCompressor({ k: 5, chunk: 8, bits });
      const b = new GradientCompressor({ k: 5, chunk: 8, bits });
      for (const g of grads) {
        const ca = a.compress('p', g, [3, 5, 64]);
        const bytes = encodeCompressed(ca);
        assert.deepEqual(encodeCompressed(b.compress('p', g, [3, 5, 64])), bytes);
        assert.equal(bytes.length, compressedBytes(ca));
        const decoded = decodeCompressed(bytes);
        assert.deepEqual(decoded, ca);
        assert.deepEqual(bytesOf(decompressGradient(decoded)), bytesOf(decompressGradient(ca)));
      }
    }
  });

  test('bad gradients are typed errors and leave the residual alone', () => {
    const gc = new GradientCompressor({ k: 2, chunk: 4, bits: 8 });
    gc.compress('w', new Float32Array(16).fill(1), [4, 4]);
    const before = gc.residual('w')!;
    assert.throws(() => gc.compress('w', new Float32Array(15), [4, 4]), { name: 'ShapeMismatchError' });
    assert.throws(() => gc.compress('w', new Float32Array(16), [2, 8]), { name: 'ShapeMismatchError' });
    assert.throws(() => gc.compress('w', new Float32Array(16).fill(Number.NaN), [4, 4]), { name: 'InvalidArgumentError' });
    assert.throws(() => gc.compress('v', new Float32Array(0), [0]), { name: 'InvalidArgumentError' });
    assert.deepEqual(gc.residual('w'), before);
  });

  test('compression ratio of a [256, 256] gradient (chunk 64, k 32)', () => {
    const rng = new Generator(6);
    const g = random(256 * 256, rng);
    const dense = denseBytes([256, 256]);
    const ratios: Record<number, number> = {};
    for (const bits of [8, 16, 32] as const) {
      const bytes = encodeCompressed(new GradientCompressor({ k: 32, chunk: 64, bits }).compress('w', g, [256, 256]));
      ratios[bits] = dense / bytes.length;
      console.log(`[256, 256] chunk 64 k 32 bits ${bits}: ${bytes.length} bytes, ${ratios[bits].toFixed(1)}× smaller than float32`);
    }
    assert.ok(ratios[8] >= 100, `bits 8 ratio ${ratios[8]}`);
    assert.ok(ratios[32] > 50);
  });

  test('a 768 × 768 gradient compresses in well under 100 ms', () => {
    const rng = new Generator(7);
    const g = random(768 * 768, rng, 1e-3);
    const gc = new GradientCompressor();
    gc.compress('w', g, [768, 768]); // warm up
    const start = performance.now();
    const steps = 5;
    let c: CompressedGradient | undefined;
    for (let t = 0; t < steps; t++) c = gc.compress('w', g, [768, 768]);
    const ms = (performance.now() - start) / steps;
    const bytes = encodeCompressed(c!);
    console.log(`[768, 768] defaults: ${ms.toFixed(1)} ms per compress, ${bytes.length} bytes, ${(denseBytes([768, 768]) / bytes.length).toFixed(1)}× smaller`);
  });
});

describe('compressed gradient wire format', () => {
  const rng = new Generator(8);
  const small = encodeCompressed(new GradientCompressor({ k: 3, chunk: 4, bits: 8 }).compress('w', random(6 * 8, rng), [6, 8]));

  test('truncated at every position, a byte too many, or a shape not expected: InvalidMessageError', () => {
    for (let n = 0; n < small.length; n++) assert.equal(tryDecode(small.subarray(0, n)), false, `truncated at ${n}`);
    assert.equal(tryDecode(Uint8Array.from([...small, 0])), false);
    assert.equal(tryDecode(small), true);
    assert.deepEqual(decodeCompressed(small, [6, 8]).shape, [6, 8]);
    for (const shape of [[48], [8, 6], [6, 8, 1]]) assert.throws(() => decodeCompressed(small, shape), { name: 'InvalidMessageError' });
  });

  test('bad magic, version, bits, chunk, k, rank, huge dims, disordered indices, -128: InvalidMessageError', () => {
    const n = decodeCompressed(small).indices.length; // [6, 8] in 4 blocks [3, 4], 3 kept each: values start at 13 + 8 + 2n
    const edits: [string, (b: Uint8Array, v: DataView) => void][] = [
      ['magic', (b) => (b[0] = 0x45)],
      ['version', (b) => (b[4] = 2)],
      ['bits', (b) => (b[5] = 4)],
      ['chunk 0', (_, v) => v.setUint16(6, 0, true)],
      ['chunk 300', (_, v) => v.setUint16(6, 300, true)],
      ['k 0', (_, v) => v.setUint32(8, 0, true)],
      ['k huge', (_, v) => v.setUint32(8, 0xffffffff, true)],
      ['rank 9', (b) => (b[12] = 9)],
      ['dim 0', (_, v) => v.setUint32(13, 0, true)],
      ['dim huge', (_, v) => v.setUint32(13, 0xffffffff, true)],
      ['dims huge', (_, v) => (v.setUint32(13, 0x10000, true), v.setUint32(17, 0x10000, true))],
      ['indices equal', (_, v) => v.setUint16(23, v.getUint16(21, true), true)],
      ['index beyond block', (_, v) => v.setUint16(25, 16, true)],
      ['code -128', (b) => (b[21 + 2 * n] = 0x80)],
      ['scale NaN', (_, v) => v.setFloat32(v.byteLength - 4, Number.NaN, true)],
      ['scale negative', (_, v) => v.setFloat32(v.byteLength - 4, -1, true)],
    ];
    for (const [what, edit] of edits) {
      const b = small.slice();
      edit(b, new DataView(b.buffer));
      assert.equal(tryDecode(b), false, what);
    }
  });

  test('10,000 random, flipped or truncated inputs only ever raise InvalidMessageError', () => {
    const r = new Generator(11);
    const valid = [small, ...([32, 16] as const).map((bits) => encodeCompressed(new GradientCompressor({ k: 2, chunk: 8, bits }).compress('w', random(5 * 8, r), [5, 8])))];
    let decoded = 0;
    for (let i = 0; i < 10_000; i++) {
      const base = valid[i % valid.length];
      let b: Uint8Array;
      if (i % 3 === 0) b = Uint8Array.from({ length: r.int(80) }, () => r.int(256));
      else if (i % 3 === 1) {
        b = base.slice();
        for (let n = 0; n < 1 + r.int(3); n++) b[r.int(b.length)] = r.int(256);
      } else b = base.subarray(0, r.int(base.length));
      if (tryDecode(b)) decoded++;
    }
    assert.ok(decoded < 10_000);
  });

  test('an inconsistent structure is refused by encode and decompress (InvalidArgumentError)', () => {
    const c = decodeCompressed(small);
    const broken: CompressedGradient[] = [
      { ...c, k: c.k + 1 },
      { ...c, indices: c.indices.slice(1) },
      { ...c, values: new Float32Array(c.values.length) },
      { ...c, scales: new Float32Array(0) },
      { ...c, shape: [6, 9] },
    ];
    for (const b of broken) {
      assert.throws(() => encodeCompressed(b), { name: 'InvalidArgumentError' });
      assert.throws(() => decompressGradient(b), { name: 'InvalidArgumentError' });
    }
  });
});
