import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  Checkpoint,
  readSafetensors,
  SafetensorsReader,
  writeCheckpoint,
  writeSafetensors,
} from '../../src/io/index.ts';
import { randn, type Tensor, tensor } from '../../src/tensor/index.ts';
import { type Encoded, loadFixture } from '../helpers/fixtures.ts';

const tmp = () => mkdtempSync(join(tmpdir(), 'tl-st-'));
const fixturePath = fileURLToPath(new URL('../fixtures/torch-mixed.safetensors', import.meta.url));

describe('safetensors', () => {
  test('reads F16, BF16, F32 and I64 exactly as PyTorch decodes them', () => {
    const expected = loadFixture<Record<string, Encoded>>('torch-mixed.json');
    const reader = SafetensorsReader.open(fixturePath);
    assert.deepEqual(reader.metadata, { format: 'pt' });
    assert.deepEqual(reader.keys().sort(), Object.keys(expected).sort());
    for (const [name, e] of Object.entries(expected)) {
      const t = reader.read(name);
      assert.deepEqual([...t.shape], e.shape, name);
      assert.deepEqual(t.toArray(), e.data.map(Math.fround), name);
    }
    reader.close();
  });

  test('F32 and int32 round-trip bit for bit; F16/BF16 round to PyTorch-compatible bits', () => {
    const dir = tmp();
    const tensors = new Map<string, Tensor>([
      ['a.weight', randn([17, 9], { seed: 1 })],
      ['ids', tensor([3, -1, 7], [3], 'int32')],
    ]);
    writeSafetensors(join(dir, 'x.safetensors'), tensors, { metadata: { format: 'pt' } });
    const back = readSafetensors(join(dir, 'x.safetensors'));
    assert.deepEqual(back.get('a.weight')!.data, tensors.get('a.weight')!.data);
    assert.deepEqual(back.get('ids')!.data, tensors.get('ids')!.data);
    for (const dtype of ['F16', 'BF16'] as const) {
      writeSafetensors(join(dir, `${dtype}.safetensors`), tensors, { dtype });
      const r = SafetensorsReader.open(join(dir, `${dtype}.safetensors`));
      assert.equal(r.info('a.weight').dtype, dtype);
      const half = r.read('a.weight');
      const err = Math.max(...half.toArray().map((v, i) => Math.abs(v - tensors.get('a.weight')!.data[i])));
      assert.ok(err < (dtype === 'F16' ? 2e-3 : 2e-2), `${dtype} rounding error ${err}`);
      r.close();
    }
  });

  test('a tensor larger than one read chunk converts across chunks', () => {
    const dir = tmp();
    const big = randn([9_000_001], { seed: 2 });
    writeSafetensors(join(dir, 'big.safetensors'), { big }, { dtype: 'BF16' });
    const back = readSafetensors(join(dir, 'big.safetensors')).get('big')!;
    assert.equal(back.size, big.size);
    for (const i of [0, 8_388_607, 8_388_608, 9_000_000])
      assert.ok(Math.abs(back.data[i] - big.data[i]) < 0.05);
  });

  test('sharded checkpoints write an index and read back key for key', () => {
    const dir = tmp();
    const tensors = new Map<string, Tensor>();
    for (let i = 0; i < 5; i++) tensors.set(`layers.${i}.weight`, randn([64, 64], { seed: i }));
    const files = writeCheckpoint(dir, tensors, { maxShardBytes: 40_000 });
    assert.ok(files.includes('model.safetensors.index.json'));
    assert.equal(readdirSync(dir).filter((f) => f.endsWith('.safetensors')).length, files.length - 1);
    const index = JSON.parse(readFileSync(join(dir, 'model.safetensors.index.json'), 'utf8'));
    assert.equal(index.metadata.total_size, 5 * 64 * 64 * 4);
    const ckpt = Checkpoint.open(dir);
    assert.deepEqual(ckpt.keys(), [...tensors.keys()]);
    for (const [k, t] of tensors) assert.deepEqual(ckpt.read(k).data, t.data);
    ckpt.close();
    const single = tmp();
    assert.deepEqual(writeCheckpoint(single, tensors), ['model.safetensors']);
    assert.equal(Checkpoint.open(single).keys().length, 5);
  });

  test('malformed files and missing paths give typed errors', () => {
    const dir = tmp();
    assert.throws(() => SafetensorsReader.open(join(dir, 'nope.safetensors')), { name: 'FileNotFoundError' });
    assert.throws(() => Checkpoint.open(join(dir, 'nothing')), { name: 'FileNotFoundError' });
    const bad = (name: string, bytes: Uint8Array) => {
      writeFileSync(join(dir, name), bytes);
      return () => SafetensorsReader.open(join(dir, name));
    };
    const withHeader = (json: string, data = 0) => {
      const h = new TextEncoder().encode(json);
      const b = new Uint8Array(8 + h.length + data);
      new DataView(b.buffer).setBigUint64(0, BigInt(h.length), true);
      b.set(h, 8);
      return b;
    };
    assert.throws(bad('short', new Uint8Array(3)), { name: 'SafetensorsFormatError' });
    assert.throws(bad('huge-header', withHeader('{}').fill(255, 0, 8)), { name: 'SafetensorsFormatError' });
    assert.throws(bad('not-json', withHeader('{nope')), { name: 'SafetensorsFormatError' });
    assert.throws(bad('dtype', withHeader('{"a":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}}', 1)), {
      name: 'SafetensorsFormatError',
    });
    assert.throws(bad('size', withHeader('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', 4)), {
      name: 'SafetensorsFormatError',
    });
    assert.throws(bad('past-end', withHeader('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 4)), {
      name: 'SafetensorsFormatError',
    });
    assert.throws(
      bad(
        'overlap',
        withHeader(
          '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
          8,
        ),
      ),
      { name: 'SafetensorsFormatError' },
    );
  });
});
