// GGUF read and write (src/io/gguf*.ts): write → read round trips for every write type, Q8_0 and Q4_0 against our
// int8/int4 packing and llama.cpp's reference quantizers (brute force), Q4_K and Q6_K dequantization against brute
// force on hand-made blocks in a file assembled by hand, metadata of every type, and the errors for broken files.
// No npm package here ships a .gguf file (`find node_modules -name '*.gguf'` finds none); test/fixtures/llama-cpp-written.gguf
// was written by llama.cpp's own ggml library (scripts/make_gguf_fixture.py: its gguf writer and quantizers, the JSON
// beside it holding the source values and ggml's dequantize_row_* of them).
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { GGUFMeta, GGUFReader, type GGUFValue, GGUFWriter, writeGGUF } from '../../src/io/gguf.ts';
import { bfloat16ToFloat, floatToBfloat16, floatToHalf, halfToFloat } from '../../src/tensor/dtype.ts';
import { packMatrix, randn, unpackMatrix } from '../../src/tensor/index.ts';
import { loadFixture } from '../helpers/fixtures.ts';

const tmp = () => mkdtempSync(join(tmpdir(), 'tl-gguf-'));
const f32 = Math.fround;
const half = (x: number) => halfToFloat(floatToHalf(x));
/** Values, with −0 as 0. */
const plain = (a: ArrayLike<number>) => Array.from(a, (v) => v + 0);

/** A seeded uniform stream in [0, 1). */
function uniform(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/** llama.cpp's quantize_row_q8_0_ref / quantize_row_q4_0_ref, producing GGUF's block bytes (brute force, one block at a time). */
function referenceBlocks(values: Float32Array, type: 'Q8_0' | 'Q4_0'): Uint8Array {
  const width = type === 'Q8_0' ? 34 : 18;
  const out = new Uint8Array((values.length / 32) * width);
  const dv = new DataView(out.buffer);
  for (let b = 0; b < values.length / 32; b++) {
    const x = Array.from(values.subarray(32 * b, 32 * b + 32));
    if (type === 'Q8_0') {
      const d = f32(Math.max(...x.map(Math.abs)) / 127);
      const id = d ? f32(1 / d) : 0;
      dv.setUint16(34 * b, floatToHalf(d), true);
      x.forEach((v, j) => {
        const t = f32(v * id);
        dv.setInt8(34 * b + 2 + j, t < 0 ? -Math.round(-t) : Math.round(t));
      });
    } else {
      let amax = 0;
      let max = 0;
      for (const v of x) if (Math.abs(v) > amax) [amax, max] = [Math.abs(v), v];
      const d = f32(max / -8);
      const id = d ? f32(1 / d) : 0;
      dv.setUint16(18 * b, floatToHalf(d), true);
      const q = (j: number) => Math.min(15, Math.trunc(f32(f32(x[j] * id) + 8.5)));
      for (let j = 0; j < 16; j++) out[18 * b + 2 + j] = q(j) | (q(j + 16) << 4);
    }
  }
  return out;
}

/** A GGUF v3 file assembled byte by byte (independent of our writer): one u32 metadata entry and raw tensors. */
function handMade(tensors: { name: string; dims: number[]; type: number; data: Uint8Array }[], alignment = 32): Uint8Array {
  const parts: number[] = [];
  const u32 = (v: number) => parts.push(v & 255, (v >> 8) & 255, (v >> 16) & 255, (v >>> 24) & 255);
  const u64 = (v: number) => {
    u32(v);
    u32(0);
  };
  const str = (s: string) => {
    u64(s.length);
    for (const c of s) parts.push(c.charCodeAt(0));
  };
  u32(0x46554747);
  u32(3);
  u64(tensors.length);
  u64(1);
  str('general.alignment');
  u32(4);
  u32(alignment);
  let rel = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    str(t.name);
    u32(t.dims.length);
    t.dims.forEach(u64);
    u32(t.type);
    u64(rel);
    offsets.push(rel);
    rel += Math.ceil(t.data.length / alignment) * alignment;
  }
  const start = Math.ceil(parts.length / alignment) * alignment;
  const out = new Uint8Array(start + rel);
  out.set(parts);
  tensors.forEach((t, i) => out.set(t.data, start + offsets[i]));
  return out;
}

/** dequantize_row_q4_K, one weight at a time from its index (brute force). */
function q4kBrute(block: Uint8Array): number[] {
  const dv = new DataView(block.buffer, block.byteOffset);
  const d = halfToFloat(dv.getUint16(0, true));
  const dmin = halfToFloat(dv.getUint16(2, true));
  const sc = block.subarray(4, 16);
  const qs = block.subarray(16, 144);
  return Array.from({ length: 256 }, (_, e) => {
    const chunk = e >> 6;
    const within = e & 63;
    const s = 2 * chunk + (within >= 32 ? 1 : 0);
    const byte = qs[32 * chunk + (within & 31)];
    const q = within < 32 ? byte & 15 : byte >> 4;
    const scale = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
    const min = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    return f32(f32(f32(d * scale) * q) - f32(dmin * min));
  });
}

/** dequantize_row_q6_K, one weight at a time from its index (brute force). */
function q6kBrute(block: Uint8Array): number[] {
  const d = halfToFloat(block[208] | (block[209] << 8));
  return Array.from({ length: 256 }, (_, e) => {
    const n = e >> 7;
    const quarter = (e & 127) >> 5;
    const l = e & 31;
    const lowByte = block[64 * n + l + (quarter & 1 ? 32 : 0)];
    const low = quarter < 2 ? lowByte & 15 : lowByte >> 4;
    const high = (block[128 + 32 * n + l] >> (2 * quarter)) & 3;
    const scale = (block[192 + 8 * n + (l >> 4) + 2 * quarter] << 24) >> 24;
    return f32(f32(d * scale) * ((low | (high << 4)) - 32));
  });
}

/** Random blocks of `bytes` each, with float16 scales put at `scaleAt` (small, positive or negative). */
function randomBlocks(count: number, bytes: number, scaleAt: number[], seed: number): Uint8Array {
  const rand = uniform(seed);
  const out = new Uint8Array(count * bytes);
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(rand() * 256);
  const dv = new DataView(out.buffer);
  for (let b = 0; b < count; b++) for (const at of scaleAt) dv.setUint16(b * bytes + at, floatToHalf((rand() - 0.5) * 0.02), true);
  return out;
}

describe('GGUF', () => {
  test('a file llama.cpp wrote: metadata, and tensors equal to ggml\'s own dequantization and to our Q8_0 / Q4_0 packing', () => {
    interface Expected {
      metadata: Record<string, unknown>;
      tensors: Record<string, { type: string; shape: number[]; source: number[]; dequantized?: number[] }>;
    }
    const expected = loadFixture<Expected>('llama-cpp-written.json');
    const r = GGUFReader.open(fileURLToPath(new URL('../fixtures/llama-cpp-written.gguf', import.meta.url)));
    assert.equal(r.version, 3);
    for (const [key, value] of Object.entries(expected.metadata)) assert.deepEqual(r.get(key), value, key);
    assert.deepEqual(['llama.block_count', 'test.i32', 'test.f32', 'test.strings'].map((k) => r.metadata.get(k)!.type), ['uint32', 'int32', 'float32', 'array']);
    assert.deepEqual(r.tensors().map((t) => t.name), Object.keys(expected.tensors));
    for (const [name, e] of Object.entries(expected.tensors)) {
      const info = r.info(name);
      assert.deepEqual([info.type, info.shape], [e.type, e.shape], name);
      const source = Float32Array.from(e.source);
      const got = plain(r.readFloat32(name));
      if (e.dequantized) assert.deepEqual(got, plain(Float32Array.from(e.dequantized)), name);
      if (e.type === 'F32') assert.deepEqual(got, plain(source));
      if (e.type === 'F16') assert.deepEqual(got, plain(Array.from(source, half)));
      if (e.type === 'BF16') assert.deepEqual(got, plain(Array.from(source, (x) => bfloat16ToFloat(floatToBfloat16(x)))));
      if (e.type === 'Q8_0' || e.type === 'Q4_0') {
        const mine = packMatrix(source, e.shape[0], e.shape[1], e.type === 'Q8_0' ? 'int8' : 'int4');
        const p = r.readPacked(name)!;
        assert.deepEqual([p.data, p.scales], [mine.data, mine.scales], name);
      }
    }
    r.close();
  });

  test('metadata of every value type, arrays included, round-trips with its types', () => {
    const path = join(tmp(), 'meta.gguf');
    const metadata: Record<string, GGUFValue> = {
      'general.architecture': GGUFMeta.str('llama'),
      'general.name': GGUFMeta.str('tiny ü 🦙'),
      'u8': { type: 'uint8', value: 255 },
      'i8': { type: 'int8', value: -128 },
      'u16': { type: 'uint16', value: 65535 },
      'i16': { type: 'int16', value: -32768 },
      'u32': GGUFMeta.u32(4294967295),
      'i32': GGUFMeta.i32(-2147483648),
      'f32': GGUFMeta.f32(f32(1e-5)),
      'f64': GGUFMeta.f64(Math.PI),
      'yes': GGUFMeta.bool(true),
      'no': GGUFMeta.bool(false),
      'u64': GGUFMeta.u64(2n ** 64n - 1n),
      'i64': { type: 'int64', value: -(2n ** 63n) },
      'tokenizer.ggml.tokens': GGUFMeta.array('string', ['a', 'Ġb', '<|endoftext|>', '']),
      'tokenizer.ggml.token_type': GGUFMeta.array('int32', [1, 1, 3, 5]),
      'scores': GGUFMeta.array('float32', [0, -1.5, f32(0.1)]),
      'flags': GGUFMeta.array('bool', [true, false]),
      'big': GGUFMeta.array('uint64', [0n, 2n ** 40n]),
      'tokenizer.ggml.merges': GGUFMeta.array('string', []),
    };
    writeGGUF(path, metadata, []);
    const r = GGUFReader.open(path);
    assert.equal(r.version, 3);
    assert.deepEqual(Object.fromEntries(r.metadata), metadata);
    assert.equal(r.get('general.architecture'), 'llama');
    assert.deepEqual(r.tensors(), []);
    r.close();
  });

  test('F32 exact, F16 and BF16 rounded as float16 / bfloat16 round, in PyTorch shapes; offsets aligned', () => {
    const path = join(tmp(), 'float.gguf');
    const w = randn([7, 5], { seed: 1 }).data as Float32Array;
    const v = randn([3, 2, 4], { seed: 2 }).data as Float32Array;
    const n = randn([9], { seed: 3 }).data as Float32Array;
    writeGGUF(path, { 'general.alignment': GGUFMeta.u32(64) }, [
      { name: 'w', shape: [7, 5], type: 'F32', data: w },
      { name: 'v', shape: [3, 2, 4], type: 'F16', data: v },
      { name: 'n', shape: [9], type: 'BF16', data: n },
    ]);
    const r = GGUFReader.open(path);
    assert.equal(r.alignment, 64);
    assert.deepEqual(r.tensors().map((t) => [t.name, t.type, t.dims, t.shape, (t.offset - r.dataOffset) % 64]), [
      ['w', 'F32', [5, 7], [7, 5], 0],
      ['v', 'F16', [4, 2, 3], [3, 2, 4], 0],
      ['n', 'BF16', [9], [9], 0],
    ]);
    assert.deepEqual(r.readFloat32('w'), w);
    assert.deepEqual([...r.read('v').shape], [3, 2, 4]);
    assert.deepEqual(plain(r.readFloat32('v')), plain(Array.from(v, half)));
    assert.deepEqual(plain(r.readFloat32('n')), plain(Array.from(n, (x) => bfloat16ToFloat(floatToBfloat16(x)))));
    // BF16 reads back as our bf16 packed matrix, the bits as they are
    const p = r.readPacked('n')!;
    assert.deepEqual([p.format, p.rows, p.cols], ['bf16', 1, 9]);
    assert.deepEqual(plain(unpackMatrix(p)), plain(r.readFloat32('n')));
    assert.equal(r.readPacked('w'), null);
    r.close();
  });

  for (const [type, format] of [['Q8_0', 'int8'], ['Q4_0', 'int4']] as const) {
    test(`${type}: the blocks are llama.cpp's reference quantizer's, and read back as our ${format} packing bit for bit`, () => {
      const path = join(tmp(), `${type}.gguf`);
      const [rows, cols] = [6, 96];
      const w = randn([rows, cols], { seed: 7 }).data as Float32Array;
      w.fill(0, 32, 64); // a block of zeros
      w[70] = 3; // a block whose largest magnitude is positive
      const mine = packMatrix(w, rows, cols, format);
      writeGGUF(path, {}, [
        { name: 'from-floats', shape: [rows, cols], type, data: w },
        { name: 'from-packed', shape: [rows, cols], type, data: mine },
      ]);
      const r = GGUFReader.open(path);
      const reference = referenceBlocks(w, type);
      for (const name of ['from-floats', 'from-packed']) {
        const raw = r.readRaw(name);
        // the only freedom: a zero block's scale is +0 here and may be −0 in llama.cpp (0 / −8)
        const zeroScale = type === 'Q8_0' ? 34 : 18;
        reference[zeroScale] = raw[zeroScale];
        reference[zeroScale + 1] = raw[zeroScale + 1];
        assert.deepEqual(raw, reference, name);
        const back = r.readPacked(name)!;
        assert.deepEqual([back.format, back.rows, back.cols], [format, rows, cols]);
        assert.deepEqual(back.data, mine.data, name);
        assert.deepEqual(back.scales, mine.scales, name);
        assert.deepEqual(plain(r.readFloat32(name)), plain(unpackMatrix(mine)), name);
      }
      r.close();
    });
  }

  test('a packed matrix of another format than planned is unpacked and encoded; a float32 tensor of a Tensor too', () => {
    const path = join(tmp(), 'mixed.gguf');
    const w = randn([4, 64], { seed: 9 }).data as Float32Array;
    const p4 = packMatrix(w, 4, 64, 'int4');
    writeGGUF(path, {}, [
      { name: 'a', shape: [4, 64], type: 'F32', data: p4 },
      { name: 'b', shape: [4, 64], type: 'Q8_0', data: p4 },
      { name: 'c', shape: [4, 64], type: 'F16', data: randn([4, 64], { seed: 9 }) },
    ]);
    const r = GGUFReader.open(path);
    assert.deepEqual(plain(r.readFloat32('a')), plain(unpackMatrix(p4)));
    assert.deepEqual(r.readPacked('b')!.data, packMatrix(unpackMatrix(p4), 4, 64, 'int8').data);
    assert.deepEqual(plain(r.readFloat32('c')), plain(Array.from(w, half)));
    r.close();
  });

  test('Q4_K and Q6_K dequantize as llama.cpp (brute force on hand-made blocks; a few values by hand)', () => {
    const q4k = randomBlocks(3, 144, [0, 2], 11);
    const q6k = randomBlocks(2, 210, [208], 12);
    // by hand: a Q4_K block with d = 1, dmin = 0.5, sub-block 0's scale 3 and min 2, sub-block 1's 2 and 1, its first
    // byte 0x21 (weight 0 in the low nibble, weight 32 in the high one)
    const known = new Uint8Array(144);
    new DataView(known.buffer).setUint16(0, floatToHalf(1), true);
    new DataView(known.buffer).setUint16(2, floatToHalf(0.5), true);
    known[4] = 3;
    known[8] = 2;
    known[5] = 2;
    known[9] = 1;
    known[16] = 0x21;
    const path = join(tmp(), 'k.gguf');
    writeFileSync(path, handMade([
      { name: 'q4k', dims: [256, 3], type: 12, data: q4k },
      { name: 'q6k', dims: [512], type: 14, data: q6k },
      { name: 'known', dims: [256], type: 12, data: known },
    ], 64));
    const r = GGUFReader.open(path);
    assert.equal(r.alignment, 64);
    const expect4 = [0, 1, 2].flatMap((b) => q4kBrute(q4k.subarray(144 * b, 144 * b + 144)));
    assert.deepEqual(plain(r.readFloat32('q4k')), plain(expect4));
    assert.deepEqual([...r.read('q4k').shape], [3, 256]);
    const expect6 = [0, 1].flatMap((b) => q6kBrute(q6k.subarray(210 * b, 210 * b + 210)));
    assert.deepEqual(plain(r.readFloat32('q6k')), plain(expect6));
    const k = r.readFloat32('known');
    assert.deepEqual([k[0], k[1], k[32], k[33]], [3 * 1 - 0.5 * 2, 3 * 0 - 0.5 * 2, 2 * 2 - 0.5 * 1, 2 * 0 - 0.5 * 1]);
    assert.equal(r.readPacked('q4k'), null);
    r.close();
  });

  test('a truncated file, a file that is not GGUF, and an unsupported tensor type are clear errors', () => {
    const dir = tmp();
    const path = join(dir, 'ok.gguf');
    writeGGUF(path, { 'general.name': GGUFMeta.str('x'), 'list': GGUFMeta.array('int32', [1, 2, 3]) }, [
      { name: 'w', shape: [2, 32], type: 'Q8_0', data: new Float32Array(64).fill(1) },
    ]);
    const bytes = readFileSync(path);
    for (const cut of [3, 10, 30, 60, 90, bytes.length - 40, bytes.length - 30]) {
      const p = join(dir, `cut-${cut}.gguf`);
      writeFileSync(p, bytes.subarray(0, cut));
      assert.throws(() => GGUFReader.open(p).close(), { name: 'GGUFFormatError' }, `cut at ${cut}`);
    }
    writeFileSync(join(dir, 'not.gguf'), 'hello, this is not a GGUF file at all');
    assert.throws(() => GGUFReader.open(join(dir, 'not.gguf')), { name: 'GGUFFormatError', message: /not a GGUF file/ });
    assert.throws(() => GGUFReader.open(join(dir, 'missing.gguf')), { name: 'FileNotFoundError' });
    // a count of metadata entries far beyond the file
    const lying = Uint8Array.from(bytes);
    new DataView(lying.buffer).setUint32(16, 1e6, true);
    writeFileSync(join(dir, 'lying.gguf'), lying);
    assert.throws(() => GGUFReader.open(join(dir, 'lying.gguf')), { name: 'GGUFFormatError' });

    const q5k = join(dir, 'q5k.gguf');
    writeFileSync(q5k, handMade([{ name: 'w', dims: [256], type: 13, data: new Uint8Array(176) }]));
    const r = GGUFReader.open(q5k);
    assert.deepEqual(r.info('w').type, { unsupported: 'Q5_K' });
    assert.throws(() => r.readFloat32('w'), (err: Error & { details?: Record<string, unknown> }) => {
      assert.equal(err.name, 'GGUFFormatError');
      assert.match(err.message, /Q5_K/);
      assert.equal(err.details?.ggmlType, 'Q5_K');
      return true;
    });
    assert.throws(() => r.read('nope'), { name: 'GGUFFormatError' });
    r.close();
  });

  test('the writer checks what it is given: block-sized rows, the planned order and shapes, metadata types', () => {
    const dir = tmp();
    assert.throws(() => GGUFWriter.create(join(dir, 'a.gguf'), {}, [{ name: 'w', shape: [2, 40], type: 'Q4_0' }]), { name: 'GGUFFormatError', message: /multiple of 32/ });
    assert.throws(() => writeGGUF(join(dir, 'b.gguf'), { x: GGUFMeta.u32(-1) }, []), { name: 'InvalidArgumentError' });
    assert.throws(() => writeGGUF(join(dir, 'b.gguf'), { x: { type: 'string', value: 3 } }, []), { name: 'InvalidArgumentError' });
    const w = GGUFWriter.create(join(dir, 'c.gguf'), {}, [{ name: 'a', shape: [4], type: 'F32' }, { name: 'b', shape: [4], type: 'F32' }]);
    assert.throws(() => w.write('b', new Float32Array(4)), { name: 'GGUFFormatError' });
    assert.throws(() => w.write('a', new Float32Array(5)), { name: 'InvalidArgumentError' });
    w.write('a', new Float32Array(4));
    assert.equal(w.expecting, 'b');
    assert.throws(() => w.close(), { name: 'GGUFFormatError', message: /closed before 'b'/ });
  });
});
