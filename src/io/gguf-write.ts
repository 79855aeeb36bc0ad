import { closeSync, mkdirSync, openSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { InvalidArgumentError } from '../errors.ts';
import { blocksPerRow, packMatrix, type PackedMatrix, Tensor, unpackMatrix } from '../tensor/index.ts';
import {
  CHUNK_BYTES,
  encodeFloats,
  GGML_TYPES,
  ggmlBytes,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_VALUE_TYPES,
  GGUF_VERSION,
  GGUF_WRITE_TYPES,
  GGUFFormatError,
  type GGUFScalar,
  type GGUFScalarType,
  type GGUFValue,
  type GGUFWriteType,
  MAX_DIMS,
  packedToBlocks,
} from './gguf-format.ts';

/**
 * Writing GGUF files (the format: gguf-format.ts; reading: gguf.ts): the header with every offset computed from the
 * planned shapes and types, then each tensor streamed in bounded chunks, padded to the alignment.
 */

/** One tensor of a GGUF file to be written: its name, PyTorch shape ([rows, cols] for a matrix) and type. */
export interface GGUFPlannedTensor {
  name: string;
  shape: number[];
  type: GGUFWriteType;
}

/** What a tensor's data may be given as: float32 values (quantized as planned) or a PackedMatrix. */
export type GGUFTensorData = ArrayLike<number> | PackedMatrix | Tensor;

const RANGES = {
  uint8: [0, 255], int8: [-128, 127], uint16: [0, 65535], int16: [-32768, 32767], uint32: [0, 4294967295], int32: [-2147483648, 2147483647],
} as const;

function isPacked(d: GGUFTensorData): d is PackedMatrix {
  return typeof (d as PackedMatrix).format === 'string' && (d as PackedMatrix).scales instanceof Float32Array;
}

const PACKED_TYPE = { int8: 'Q8_0', int4: 'Q4_0', bf16: 'BF16' } as const;

/** The bytes of one value, array or scalar, of the metadata. */
class ByteSink {
  private chunks: Uint8Array[] = [];
  length = 0;

  push(bytes: Uint8Array): void {
    this.chunks.push(bytes);
    this.length += bytes.length;
  }

  num(kind: 'u32' | 'u64', v: number | bigint): void {
    const b = new Uint8Array(kind === 'u32' ? 4 : 8);
    const dv = new DataView(b.buffer);
    if (kind === 'u32') dv.setUint32(0, Number(v), true);
    else dv.setBigUint64(0, BigInt(v), true);
    this.push(b);
  }

  string(s: string): void {
    const bytes = new TextEncoder().encode(s);
    this.num('u64', bytes.length);
    this.push(bytes);
  }

  scalar(type: GGUFScalarType, v: GGUFScalar, key: string): void {
    const bad = () => new InvalidArgumentError(`GGUF metadata '${key}': ${JSON.stringify(typeof v === 'bigint' ? String(v) : v)} is not a ${type}`);
    if (type === 'string') {
      if (typeof v !== 'string') throw bad();
      return this.string(v);
    }
    if (type === 'bool') {
      if (typeof v !== 'boolean') throw bad();
      return this.push(new Uint8Array([v ? 1 : 0]));
    }
    if (type === 'uint64' || type === 'int64') {
      if (typeof v !== 'bigint' && !(typeof v === 'number' && Number.isInteger(v))) throw bad();
      const b = new Uint8Array(8);
      if (type === 'uint64') new DataView(b.buffer).setBigUint64(0, BigInt(v), true);
      else new DataView(b.buffer).setBigInt64(0, BigInt(v), true);
      return this.push(b);
    }
    if (typeof v !== 'number') throw bad();
    const width = { uint8: 1, int8: 1, uint16: 2, int16: 2, uint32: 4, int32: 4, float32: 4, float64: 8 }[type];
    const b = new Uint8Array(width);
    const dv = new DataView(b.buffer);
    if (type === 'float32') dv.setFloat32(0, v, true);
    else if (type === 'float64') dv.setFloat64(0, v, true);
    else {
      const [lo, hi] = RANGES[type];
      if (!Number.isInteger(v) || v < lo || v > hi) throw bad();
      if (type === 'uint8') dv.setUint8(0, v);
      else if (type === 'int8') dv.setInt8(0, v);
      else if (type === 'uint16') dv.setUint16(0, v, true);
      else if (type === 'int16') dv.setInt16(0, v, true);
      else if (type === 'uint32') dv.setUint32(0, v, true);
      else dv.setInt32(0, v, true);
    }
    this.push(b);
  }

  value(key: string, v: GGUFValue): void {
    this.num('u32', GGUF_VALUE_TYPES.indexOf(v.type));
    if (v.type !== 'array') return this.scalar(v.type, v.value, key);
    this.num('u32', GGUF_VALUE_TYPES.indexOf(v.itemType));
    this.num('u64', v.value.length);
    for (const item of v.value) this.scalar(v.itemType, item, key);
  }

  bytes(): Uint8Array {
    const out = new Uint8Array(this.length);
    let at = 0;
    for (const c of this.chunks) {
      out.set(c, at);
      at += c.length;
    }
    return out;
  }
}

/**
 * A GGUF file written tensor by tensor as the tensors become available: the header (metadata, every name, shape,
 * type and offset) first, then each tensor in the planned order, each padded to the alignment. Nothing but the
 * tensor being written is held.
 */
export class GGUFWriter {
  private next = 0;

  private constructor(
    readonly path: string,
    private fd: number | null,
    private readonly planned: (GGUFPlannedTensor & { bytes: number })[],
    private readonly alignment: number,
  ) {}

  /** `metadata` in the order given; `general.alignment` (a uint32), if there, sets the alignment (default 32). */
  static create(path: string, metadata: Record<string, GGUFValue>, planned: GGUFPlannedTensor[]): GGUFWriter {
    const align = metadata['general.alignment'];
    const alignment = align === undefined ? GGUF_DEFAULT_ALIGNMENT : Number(align.value);
    if (!Number.isInteger(alignment) || alignment <= 0 || alignment % 8 !== 0) throw new InvalidArgumentError(`general.alignment must be a positive multiple of 8, got ${String(align?.value)}`);
    const names = new Set<string>();
    const sized = planned.map((t) => {
      if (!(GGUF_WRITE_TYPES as readonly string[]).includes(t.type)) throw new InvalidArgumentError(`cannot write '${t.name}' as ${t.type} (${GGUF_WRITE_TYPES.join(', ')})`);
      if (names.has(t.name)) throw new InvalidArgumentError(`tensor '${t.name}' is planned twice`);
      names.add(t.name);
      if (t.shape.length < 1 || t.shape.length > MAX_DIMS || t.shape.some((d) => !Number.isInteger(d) || d < 0)) {
        throw new InvalidArgumentError(`tensor '${t.name}' has shape [${t.shape}]: GGUF takes 1 to ${MAX_DIMS} dims`);
      }
      const count = t.shape.reduce((a, b) => a * b, 1);
      return { ...t, shape: [...t.shape], bytes: ggmlBytes(t.type, t.shape[t.shape.length - 1], count, `tensor '${t.name}'`) };
    });
    const head = new ByteSink();
    head.num('u32', GGUF_MAGIC);
    head.num('u32', GGUF_VERSION);
    head.num('u64', sized.length);
    head.num('u64', Object.keys(metadata).length);
    for (const [key, v] of Object.entries(metadata)) {
      head.string(key);
      head.value(key, v);
    }
    let rel = 0;
    for (const t of sized) {
      head.string(t.name);
      head.num('u32', t.shape.length);
      for (const d of [...t.shape].reverse()) head.num('u64', d);
      head.num('u32', GGML_TYPES[t.type]);
      head.num('u64', rel);
      rel += Math.ceil(t.bytes / alignment) * alignment;
    }
    head.push(new Uint8Array(Math.ceil(head.length / alignment) * alignment - head.length));
    mkdirSync(dirname(path), { recursive: true });
    const fd = openSync(path, 'w');
    writeSync(fd, head.bytes());
    return new GGUFWriter(path, fd, sized, alignment);
  }

  /** The name the next `write` must bring, or null when the file is complete. */
  get expecting(): string | null {
    return this.planned[this.next]?.name ?? null;
  }

  /**
   * Writes the next planned tensor. Float32 values are encoded as planned (Q8_0 and Q4_0 quantized as our int8 and int4,
   * which are llama.cpp's Q8_0 and Q4_0); a PackedMatrix of the planned format (int8 for Q8_0, int4 for Q4_0, bf16 for
   * BF16) is written exactly as it is, one of another format is unpacked and encoded.
   */
  write(name: string, data: GGUFTensorData): void {
    const t = this.planned[this.next];
    if (this.fd === null) throw new GGUFFormatError(`${this.path}: writer is closed`);
    if (!t || t.name !== name) throw new GGUFFormatError(`${this.path}: expected '${t?.name ?? 'nothing'}', got '${name}'`);
    const fd = this.fd;
    const cols = t.shape[t.shape.length - 1];
    const rows = t.shape.slice(0, -1).reduce((a, b) => a * b, 1);
    const values = data instanceof Tensor ? (data.packed ?? data.data) : data;
    const count = isPacked(values) ? values.rows * values.cols : values.length;
    if (count !== rows * cols || (isPacked(values) && values.cols !== cols)) {
      throw new InvalidArgumentError(`${this.path}: '${name}' was planned as [${t.shape}], got ${isPacked(values) ? `a [${values.rows}, ${values.cols}] packed matrix` : `${count} values`}`);
    }
    const per = Math.max(1, Math.floor(CHUNK_BYTES / Math.max(1, 4 * cols)));
    for (let r = 0; r < rows; r += per) {
      const n = Math.min(per, rows - r);
      writeSync(fd, this.encode(t.type, values, r, n, cols));
    }
    writeSync(fd, new Uint8Array(Math.ceil(t.bytes / this.alignment) * this.alignment - t.bytes));
    this.next++;
  }

  private encode(type: GGUFWriteType, values: ArrayLike<number> | PackedMatrix, r: number, n: number, cols: number): Uint8Array {
    if (isPacked(values)) {
      if (PACKED_TYPE[values.format] === type) return packedToBlocks(values, r, n);
      return this.encode(type, unpackRows(values, r, n), 0, n, cols);
    }
    if (type === 'F32' || type === 'F16' || type === 'BF16') return encodeFloats(type, values, r * cols, n * cols);
    let slice: Float32Array;
    if (values instanceof Float32Array) slice = values.subarray(r * cols, (r + n) * cols);
    else {
      slice = new Float32Array(n * cols);
      for (let i = 0; i < slice.length; i++) slice[i] = values[r * cols + i];
    }
    return packedToBlocks(packMatrix(slice, n, cols, type === 'Q8_0' ? 'int8' : 'int4'), 0, n);
  }

  /** Closes the file without completing it (a write that failed half-way): no descriptor is left open. */
  abandon(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }

  /** Closes the file; an incomplete one is an error (its header promises tensors that never came). */
  close(): void {
    if (this.fd === null) return;
    closeSync(this.fd);
    this.fd = null;
    if (this.next < this.planned.length) throw new GGUFFormatError(`${this.path}: closed before '${this.planned[this.next].name}' was written`);
  }
}

/** Rows [r, r + n) of a packed matrix as float32. */
function unpackRows(p: PackedMatrix, r: number, n: number): Float32Array {
  if (p.format === 'bf16') return unpackMatrix({ ...p, rows: n, data: (p.data as Uint16Array).subarray(r * p.cols, (r + n) * p.cols) });
  const blocks = blocksPerRow(p.cols);
  const blob = p.format === 'int8' ? 32 : 16;
  const data = (p.data as Uint8Array).subarray(r * blocks * blob, (r + n) * blocks * blob);
  return unpackMatrix({ ...p, rows: n, data, scales: p.scales.subarray(r * blocks, (r + n) * blocks) });
}

/** A whole GGUF file at once (tensors in the order given). */
export function writeGGUF(
  path: string,
  metadata: Record<string, GGUFValue>,
  tensors: (GGUFPlannedTensor & { data: GGUFTensorData })[],
): void {
  const writer = GGUFWriter.create(path, metadata, tensors);
  try {
    for (const t of tensors) writer.write(t.name, t.data);
    writer.close();
  } finally {
    writer.abandon();
  }
}
