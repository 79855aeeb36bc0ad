import { closeSync, fstatSync, readSync } from 'node:fs';
import { type PackedMatrix, Tensor } from '../tensor/index.ts';
import { openFile, readExactly as readFileExactly } from './read-file.ts';
import {
  blocksToPacked,
  CHUNK_BYTES,
  decodeBlocks,
  GGML_TYPES,
  ggmlBytes,
  type GGMLType,
  ggmlTypeOf,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_VALUE_TYPES,
  GGUF_VERSION,
  GGUFFormatError,
  type GGUFScalar,
  type GGUFScalarType,
  type GGUFValue,
  MAX_DIMS,
} from './gguf-format.ts';

/**
 * GGUF files on disk (the format: gguf-format.ts). Reading parses the header and metadata once, then reads each
 * tensor on demand with positioned reads in bounded chunks, so a file of many gigabytes is never held whole.
 * Writing (gguf-write.ts) streams tensor by tensor after a header whose offsets come from the planned shapes and types.
 * The metadata parser is our own: `@huggingface/gguf` is not installed here, would be a new dependency (with
 * `@huggingface/tasks`), and reads through fetch and range requests asynchronously, while this reader is synchronous
 * like the safetensors one and needs the tensor table and offsets it parses anyway.
 */

/** A tensor of a GGUF file: its dims as GGUF lists them (ne, fastest first) and as PyTorch does (shape). */
export interface GGUFTensorInfo {
  name: string;
  /** The type, or `{ unsupported: name }` for a type this reader does not decode (reading it throws). */
  type: GGMLType | { unsupported: string };
  /** ne[0] (a row's length) first. */
  dims: number[];
  /** dims reversed: [rows, cols] for a matrix. */
  shape: number[];
  /** Absolute position of its data in the file. */
  offset: number;
  /** Bytes of its data (0 for an unsupported type, whose size is not known here). */
  byteLength: number;
}

/** Buffered little-endian reads of a file from the start, for the header and metadata. */
class HeaderCursor {
  private buf = new Uint8Array(1 << 20);
  private view = new DataView(this.buf.buffer);
  private start = 0;
  private length = 0;
  pos = 0;

  constructor(
    private readonly fd: number,
    readonly size: number,
    private readonly path: string,
  ) {}

  private need(n: number, what: string): number {
    if (this.pos + n > this.size) throw new GGUFFormatError(`${this.path}: file ends inside its ${what} (truncated?)`);
    if (this.pos < this.start || this.pos + n > this.start + this.length) {
      if (n > this.buf.length) {
        this.buf = new Uint8Array(n);
        this.view = new DataView(this.buf.buffer);
      }
      this.start = this.pos;
      this.length = readSync(this.fd, this.buf, 0, Math.min(this.buf.length, this.size - this.pos), this.pos);
      if (this.length < n) throw new GGUFFormatError(`${this.path}: file ends inside its ${what} (truncated?)`);
    }
    const at = this.pos - this.start;
    this.pos += n;
    return at;
  }

  u32(what: string): number {
    return this.view.getUint32(this.need(4, what), true);
  }

  u64(what: string): number {
    const v = this.view.getBigUint64(this.need(8, what), true);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new GGUFFormatError(`${this.path}: ${what} ${v} is impossibly large`);
    return Number(v);
  }

  string(what: string): string {
    const n = this.u64(what);
    if (n > this.size - this.pos) throw new GGUFFormatError(`${this.path}: a ${n}-byte string in its ${what} runs past the end of the file`);
    const at = this.need(n, what);
    return new TextDecoder('utf-8').decode(this.buf.subarray(at, at + n));
  }

  scalar(type: GGUFScalarType, what: string): GGUFScalar {
    const v = this.view;
    switch (type) {
      case 'uint8': return v.getUint8(this.need(1, what));
      case 'int8': return v.getInt8(this.need(1, what));
      case 'uint16': return v.getUint16(this.need(2, what), true);
      case 'int16': return v.getInt16(this.need(2, what), true);
      case 'uint32': return v.getUint32(this.need(4, what), true);
      case 'int32': return v.getInt32(this.need(4, what), true);
      case 'float32': return v.getFloat32(this.need(4, what), true);
      case 'bool': return v.getUint8(this.need(1, what)) !== 0;
      case 'string': return this.string(what);
      case 'uint64': return v.getBigUint64(this.need(8, what), true);
      case 'int64': return v.getBigInt64(this.need(8, what), true);
      case 'float64': return v.getFloat64(this.need(8, what), true);
    }
  }

  valueType(what: string): (typeof GGUF_VALUE_TYPES)[number] {
    const id = this.u32(what);
    const type = GGUF_VALUE_TYPES[id];
    if (type === undefined) throw new GGUFFormatError(`${this.path}: unknown metadata value type ${id} in ${what}`);
    return type;
  }

  value(what: string): GGUFValue {
    const type = this.valueType(what);
    if (type !== 'array') return { type, value: this.scalar(type, what) };
    const itemType = this.valueType(what);
    if (itemType === 'array') throw new GGUFFormatError(`${this.path}: ${what} is an array of arrays, which GGUF readers do not support`);
    const count = this.u64(what);
    if (count > this.size - this.pos) throw new GGUFFormatError(`${this.path}: ${what} claims ${count} items, more than the file holds`);
    const value: GGUFScalar[] = new Array(count);
    for (let i = 0; i < count; i++) value[i] = this.scalar(itemType, what);
    return { type, itemType, value };
  }
}

function readExactly(fd: number, target: Uint8Array, position: number, where: string): void {
  readFileExactly(fd, target, position, where, (message) => new GGUFFormatError(message));
}

/**
 * A GGUF file opened for lazy, tensor-by-tensor reading. Close it when done.
 * @example
 * const r = GGUFReader.open('model.gguf')
 * r.get('general.architecture')            // 'llama'
 * const w = r.read('blk.0.attn_q.weight')  // float32 Tensor [rows, cols]
 * r.close()
 */
export class GGUFReader {
  private constructor(
    readonly path: string,
    private fd: number | null,
    readonly version: number,
    readonly metadata: Map<string, GGUFValue>,
    private readonly infos: Map<string, GGUFTensorInfo>,
    readonly alignment: number,
    readonly dataOffset: number,
  ) {}

  static open(path: string): GGUFReader {
    const fd = openFile(path);
    try {
      const size = fstatSync(fd).size;
      const c = new HeaderCursor(fd, size, path);
      if (size < 24 || c.u32('magic') !== GGUF_MAGIC) throw new GGUFFormatError(`${path} is not a GGUF file (no GGUF magic at its start)`);
      const version = c.u32('version');
      if (version !== 2 && version !== GGUF_VERSION) throw new GGUFFormatError(`${path}: GGUF version ${version} is not supported (2 and 3 are)`);
      const tensorCount = c.u64('tensor count');
      const kvCount = c.u64('metadata count');
      if (tensorCount > size || kvCount > size) throw new GGUFFormatError(`${path}: ${tensorCount} tensors and ${kvCount} metadata entries cannot fit ${size} bytes`);
      const metadata = new Map<string, GGUFValue>();
      for (let i = 0; i < kvCount; i++) {
        const key = c.string(`metadata key ${i}`);
        metadata.set(key, c.value(`metadata '${key}'`));
      }
      const align = metadata.get('general.alignment');
      const alignment = align === undefined ? GGUF_DEFAULT_ALIGNMENT : Number(align.value);
      if (!Number.isInteger(alignment) || alignment <= 0 || alignment % 8 !== 0) throw new GGUFFormatError(`${path}: general.alignment ${String(align?.value)} is not a positive multiple of 8`);
      const raw: { name: string; dims: number[]; typeId: number; rel: number }[] = [];
      for (let i = 0; i < tensorCount; i++) {
        const name = c.string(`tensor info ${i}`);
        const nDims = c.u32(`tensor '${name}'`);
        if (nDims < 1 || nDims > MAX_DIMS) throw new GGUFFormatError(`${path}: tensor '${name}' has ${nDims} dims (1 to ${MAX_DIMS})`);
        const dims = Array.from({ length: nDims }, () => c.u64(`tensor '${name}' dims`));
        raw.push({ name, dims, typeId: c.u32(`tensor '${name}' type`), rel: c.u64(`tensor '${name}' offset`) });
      }
      const dataOffset = Math.ceil(c.pos / alignment) * alignment;
      const infos = new Map<string, GGUFTensorInfo>();
      for (const { name, dims, typeId, rel } of raw) {
        if (infos.has(name)) throw new GGUFFormatError(`${path}: tensor '${name}' appears twice`);
        if (rel % alignment !== 0) throw new GGUFFormatError(`${path}: tensor '${name}' starts at ${rel}, not a multiple of the alignment ${alignment}`);
        const type = ggmlTypeOf(typeId);
        const count = dims.reduce((a, b) => a * b, 1);
        const byteLength = typeof type === 'string' ? ggmlBytes(type, dims[0], count, `${path} '${name}'`) : 0;
        const offset = dataOffset + rel;
        if (offset + byteLength > size) {
          throw new GGUFFormatError(`${path}: tensor '${name}' needs bytes up to ${offset + byteLength}, the file has ${size} (truncated?)`);
        }
        infos.set(name, { name, type, dims, shape: [...dims].reverse(), offset, byteLength });
      }
      return new GGUFReader(path, fd, version, metadata, infos, alignment, dataOffset);
    } catch (err) {
      closeSync(fd);
      throw err;
    }
  }

  /** A metadata value without its type (64-bit integers as bigint), or undefined. */
  get(key: string): GGUFScalar | GGUFScalar[] | undefined {
    return this.metadata.get(key)?.value;
  }

  /** Every tensor, in the file's order. */
  tensors(): GGUFTensorInfo[] {
    return [...this.infos.values()];
  }

  has(name: string): boolean {
    return this.infos.has(name);
  }

  info(name: string): GGUFTensorInfo {
    const info = this.infos.get(name);
    if (info === undefined) throw new GGUFFormatError(`${this.path}: no tensor named '${name}'`);
    return info;
  }

  private supported(name: string): { info: GGUFTensorInfo; type: GGMLType; fd: number } {
    if (this.fd === null) throw new GGUFFormatError(`${this.path}: reader is closed`);
    const info = this.info(name);
    if (typeof info.type !== 'string') {
      throw new GGUFFormatError(`${this.path}: tensor '${name}' is ${info.type.unsupported}, which this reader does not read (${Object.keys(GGML_TYPES).join(', ')})`, {
        details: { tensor: name, ggmlType: info.type.unsupported },
      });
    }
    return { info, type: info.type, fd: this.fd };
  }

  /** A tensor's data bytes as they are in the file. */
  readRaw(name: string): Uint8Array {
    const { info, fd } = this.supported(name);
    const out = new Uint8Array(info.byteLength);
    readExactly(fd, out, info.offset, `${this.path} '${name}'`);
    return out;
  }

  /** Calls `each(bytes, firstRow, rows)` on consecutive whole rows of a tensor, at most about CHUNK_BYTES at a time. */
  private eachRows(name: string, each: (bytes: Uint8Array, first: number, rows: number) => void): void {
    const { info, fd } = this.supported(name);
    const rows = info.dims.slice(1).reduce((a, b) => a * b, 1);
    const rowBytes = rows === 0 ? 0 : info.byteLength / rows;
    const per = Math.max(1, Math.floor(CHUNK_BYTES / Math.max(1, rowBytes)));
    const buf = new Uint8Array(Math.min(rows, per) * rowBytes);
    for (let r = 0; r < rows; r += per) {
      const n = Math.min(per, rows - r);
      const view = buf.subarray(0, n * rowBytes);
      readExactly(fd, view, info.offset + r * rowBytes, `${this.path} '${name}'`);
      each(view, r, n);
    }
  }

  /** A tensor's weights as float32, row-major in PyTorch's order (Q4_K and Q6_K dequantized as llama.cpp does). */
  readFloat32(name: string): Float32Array {
    const { info, type } = this.supported(name);
    const cols = info.dims[0];
    const out = new Float32Array(info.dims.reduce((a, b) => a * b, 1));
    this.eachRows(name, (bytes, first, n) => decodeBlocks(type, bytes, n * cols, out, first * cols));
    return out;
  }

  /** A tensor as a float32 Tensor of its PyTorch shape. */
  read(name: string): Tensor {
    return new Tensor(this.readFloat32(name), this.info(name).shape);
  }

  /**
   * A Q8_0, Q4_0 or BF16 tensor as our int8, int4 or bf16 PackedMatrix, exactly (rows: every dim but ne[0]; cols: ne[0]);
   * null for the other types (read them with readFloat32 and pack the values).
   */
  readPacked(name: string): PackedMatrix | null {
    const { info, type } = this.supported(name);
    if (type !== 'Q8_0' && type !== 'Q4_0' && type !== 'BF16') return null;
    const cols = info.dims[0];
    const rows = info.dims.slice(1).reduce((a, b) => a * b, 1);
    const format = type === 'Q8_0' ? 'int8' : type === 'Q4_0' ? 'int4' : 'bf16';
    const p: PackedMatrix = format === 'bf16'
      ? { format, rows, cols, data: new Uint16Array(rows * cols), scales: new Float32Array(0) }
      : { format, rows, cols, data: new Uint8Array((rows * cols * (format === 'int8' ? 32 : 16)) / 32), scales: new Float32Array((rows * cols) / 32) };
    this.eachRows(name, (bytes, first, n) => blocksToPacked(type, bytes, p, first, n));
    return p;
  }

  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

export { type GGUFPlannedTensor, type GGUFTensorData, GGUFWriter, writeGGUF } from './gguf-write.ts';
export {
  decodeBlocks,
  GGML_BLOCK,
  GGML_TYPES,
  type GGMLType,
  GGUF_WRITE_TYPES,
  GGUFFormatError,
  GGUFMeta,
  type GGUFScalar,
  type GGUFScalarType,
  type GGUFValue,
  type GGUFValueType,
  type GGUFWriteType,
} from './gguf-format.ts';
