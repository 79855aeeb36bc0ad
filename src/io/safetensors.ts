import {
  closeSync,
  existsSync,
  fstatSync,
  mkdirSync,
  openSync,
  readFileSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { FileNotFoundError, SafetensorsFormatError } from '../errors.ts';
import { bfloat16ToFloat, floatToBfloat16, floatToHalf, halfToFloat, sizeOf, Tensor } from '../tensor/index.ts';
import { openFile, READ_CHUNK_BYTES, readExactly as readFileExactly } from './read-file.ts';
import {
  buildHeader,
  MAX_HEADER_BYTES,
  parseHeader,
  SAFE_DTYPE_BYTES,
  type SafeDType,
  type TensorEntry,
} from './safetensors-format.ts';

/**
 * Safetensors files on disk. Reading opens the file, parses the header and reads each
 * tensor on demand with positioned reads in bounded chunks, so a multi-gigabyte
 * checkpoint is never held in one buffer. F16 and BF16 widen to float32; I64 narrows to
 * int32 (with a range check). Writing streams tensor by tensor.
 */

const CHUNK_BYTES = READ_CHUNK_BYTES;

function readExactly(fd: number, target: Uint8Array, position: number, where: string): void {
  readFileExactly(fd, target, position, where, (message) => new SafetensorsFormatError(message));
}

/** A safetensors file opened for lazy, tensor-by-tensor reading. Close it when done. */
export class SafetensorsReader {
  private constructor(
    readonly path: string,
    private fd: number | null,
    private readonly entries: Map<string, TensorEntry>,
    readonly metadata: Record<string, string>,
  ) {}

  static open(path: string): SafetensorsReader {
    const fd = openFile(path);
    try {
      const size = fstatSync(fd).size;
      if (size < 8) throw new SafetensorsFormatError(`${path}: too short to be a safetensors file`);
      const prefix = new Uint8Array(8);
      readExactly(fd, prefix, 0, path);
      const headerLength = Number(new DataView(prefix.buffer).getBigUint64(0, true));
      if (headerLength > MAX_HEADER_BYTES || headerLength > size - 8) {
        throw new SafetensorsFormatError(
          `${path}: header length ${headerLength} is impossible for a ${size}-byte file`,
        );
      }
      const header = new Uint8Array(headerLength);
      readExactly(fd, header, 8, path);
      const parsed = parseHeader(new TextDecoder().decode(header), headerLength, size, path);
      return new SafetensorsReader(path, fd, parsed.entries, parsed.metadata);
    } catch (err) {
      closeSync(fd);
      throw err;
    }
  }

  keys(): string[] {
    return [...this.entries.keys()];
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  info(name: string): { dtype: SafeDType; shape: number[]; byteLength: number } {
    const e = this.entry(name);
    return { dtype: e.dtype, shape: [...e.shape], byteLength: e.end - e.begin };
  }

  private entry(name: string): TensorEntry {
    const e = this.entries.get(name);
    if (e === undefined) throw new SafetensorsFormatError(`${this.path}: no tensor named '${name}'`);
    return e;
  }

  /** Reads one tensor: floats as float32 (or float64 for F64), integers as int32. */
  read(name: string): Tensor {
    if (this.fd === null) throw new SafetensorsFormatError(`${this.path}: reader is closed`);
    const fd = this.fd;
    const e = this.entry(name);
    const count = sizeOf(e.shape);
    const where = `${this.path} '${name}'`;
    if (e.dtype === 'F32' || e.dtype === 'F64' || e.dtype === 'I32') {
      const out
        = e.dtype === 'F32'
          ? new Float32Array(count)
          : e.dtype === 'F64'
            ? new Float64Array(count)
            : new Int32Array(count);
      readExactly(fd, new Uint8Array(out.buffer), e.begin, where);
      return new Tensor(out, e.shape);
    }
    const width = SAFE_DTYPE_BYTES[e.dtype];
    const out = e.dtype === 'I64' ? new Int32Array(count) : new Float32Array(count);
    const per = Math.floor(CHUNK_BYTES / width);
    const chunk = new Uint8Array(Math.min(count, per) * width);
    for (let start = 0; start < count; start += per) {
      const n = Math.min(per, count - start);
      const view = chunk.subarray(0, n * width);
      readExactly(fd, view, e.begin + start * width, where);
      const dv = new DataView(view.buffer, view.byteOffset, view.byteLength);
      if (e.dtype === 'F16')
        for (let i = 0; i < n; i++) out[start + i] = halfToFloat(dv.getUint16(2 * i, true));
      else if (e.dtype === 'BF16')
        for (let i = 0; i < n; i++) out[start + i] = bfloat16ToFloat(dv.getUint16(2 * i, true));
      else {
        for (let i = 0; i < n; i++) {
          const v = dv.getBigInt64(8 * i, true);
          if (v > 2147483647n || v < -2147483648n)
            throw new SafetensorsFormatError(`${where}: value ${v} does not fit int32`);
          out[start + i] = Number(v);
        }
      }
    }
    return new Tensor(out, e.shape);
  }

  /**
   * Elements [start, start + count) of a float tensor as float32 (F16 and BF16 widened, F64
   * narrowed): a window of a weight, so a large one is streamed without being held whole.
   * `into` (at least `count` long) takes the values instead of a new array.
   */
  readFloat32(name: string, start: number, count: number, into?: Float32Array): Float32Array {
    if (this.fd === null) throw new SafetensorsFormatError(`${this.path}: reader is closed`);
    const e = this.entry(name);
    const where = `${this.path} '${name}'`;
    if (!Number.isSafeInteger(start) || !Number.isSafeInteger(count) || start < 0 || count < 0 || start + count > sizeOf(e.shape)) {
      throw new SafetensorsFormatError(`${where}: elements [${start}, ${start + count}) are outside its ${sizeOf(e.shape)}`);
    }
    if (e.dtype === 'I32' || e.dtype === 'I64') throw new SafetensorsFormatError(`${where}: ${e.dtype} is not a float tensor`);
    const out = into ? into.subarray(0, count) : new Float32Array(count);
    const width = SAFE_DTYPE_BYTES[e.dtype];
    if (e.dtype === 'F32') {
      readExactly(this.fd, new Uint8Array(out.buffer, out.byteOffset, out.byteLength), e.begin + 4 * start, where);
      return out;
    }
    const bytes = new Uint8Array(count * width);
    readExactly(this.fd, bytes, e.begin + width * start, where);
    const dv = new DataView(bytes.buffer);
    if (e.dtype === 'F64') for (let i = 0; i < count; i++) out[i] = dv.getFloat64(8 * i, true);
    else if (e.dtype === 'F16') for (let i = 0; i < count; i++) out[i] = halfToFloat(dv.getUint16(2 * i, true));
    else for (let i = 0; i < count; i++) out[i] = bfloat16ToFloat(dv.getUint16(2 * i, true));
    return out;
  }

  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

/** Reads every tensor of one file. */
export function readSafetensors(path: string): Map<string, Tensor> {
  const reader = SafetensorsReader.open(path);
  try {
    return new Map(reader.keys().map((k) => [k, reader.read(k)]));
  } finally {
    reader.close();
  }
}

export interface WriteOptions {
  /** Storage type for float tensors (default F32; int32 tensors are always I32). */
  dtype?: 'F32' | 'F16' | 'BF16';
  metadata?: Record<string, string>;
}

function storageType(t: Tensor, dtype: WriteOptions['dtype']): SafeDType {
  if (t.dtype === 'int32') return 'I32';
  if (t.dtype === 'float64' && dtype === undefined) return 'F64';
  return dtype ?? 'F32';
}

/** A little-endian machine writes float32 data as it is in memory (no copy). */
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

function encodeChunk(t: Tensor, dtype: SafeDType, start: number, n: number): Uint8Array {
  const width = SAFE_DTYPE_BYTES[dtype];
  if (dtype === 'F32' && t.data instanceof Float32Array && LITTLE_ENDIAN) return new Uint8Array(t.data.buffer, t.data.byteOffset + 4 * start, 4 * n);
  const bytes = new Uint8Array(n * width);
  const dv = new DataView(bytes.buffer);
  const src = t.data;
  for (let i = 0; i < n; i++) {
    const v = src[start + i];
    if (dtype === 'F32') dv.setFloat32(4 * i, v, true);
    else if (dtype === 'F64') dv.setFloat64(8 * i, v, true);
    else if (dtype === 'I32') dv.setInt32(4 * i, v, true);
    else if (dtype === 'F16') dv.setUint16(2 * i, floatToHalf(v), true);
    else if (dtype === 'BF16') dv.setUint16(2 * i, floatToBfloat16(v), true);
    else dv.setBigInt64(8 * i, BigInt(v), true);
  }
  return bytes;
}

/** Writes tensors to one file, streaming each in bounded chunks. */
export function writeSafetensors(
  path: string,
  tensors: Map<string, Tensor> | Record<string, Tensor>,
  options: WriteOptions = {},
): void {
  const list = [...(tensors instanceof Map ? tensors : Object.entries(tensors))].map(([name, t]) => ({
    name,
    tensor: t,
    dtype: storageType(t, options.dtype),
    shape: t.shape,
  }));
  const { bytes } = buildHeader(list, options.metadata);
  mkdirSync(dirname(path), { recursive: true });
  const fd = openSync(path, 'w');
  try {
    writeSync(fd, bytes);
    for (const { tensor, dtype } of list) {
      const per = Math.floor(CHUNK_BYTES / SAFE_DTYPE_BYTES[dtype]);
      for (let start = 0; start < tensor.size; start += per) {
        writeSync(fd, encodeChunk(tensor, dtype, start, Math.min(per, tensor.size - start)));
      }
    }
  } finally {
    closeSync(fd);
  }
}

export const INDEX_FILE = 'model.safetensors.index.json';
export const SINGLE_FILE = 'model.safetensors';

/** One tensor of a checkpoint to be written: its name, shape and storage type. */
export interface PlannedTensor {
  name: string;
  shape: number[];
  dtype: SafeDType;
}

/** The files of a checkpoint: one `model.safetensors`, or shards of at most `maxShardBytes` each (Hugging Face's names). */
export function planShards(tensors: PlannedTensor[], maxShardBytes = 5 * 1024 ** 3): { file: string; tensors: PlannedTensor[] }[] {
  const shards: PlannedTensor[][] = [[]];
  let current = 0;
  for (const t of tensors) {
    const n = sizeOf(t.shape) * SAFE_DTYPE_BYTES[t.dtype];
    if (current > 0 && current + n > maxShardBytes) {
      shards.push([]);
      current = 0;
    }
    shards[shards.length - 1].push(t);
    current += n;
  }
  if (shards.length === 1) return [{ file: SINGLE_FILE, tensors: shards[0] }];
  const pad = (i: number) => String(i).padStart(5, '0');
  return shards.map((ts, i) => ({ file: `model-${pad(i + 1)}-of-${pad(shards.length)}.safetensors`, tensors: ts }));
}

/** The index of a sharded checkpoint (`model.safetensors.index.json`), for shards as planShards made them. */
export function writeShardIndex(dir: string, shards: { file: string; tensors: PlannedTensor[] }[]): void {
  const weightMap: Record<string, string> = {};
  let total = 0;
  for (const shard of shards) {
    for (const t of shard.tensors) {
      weightMap[t.name] = shard.file;
      total += sizeOf(t.shape) * SAFE_DTYPE_BYTES[t.dtype];
    }
  }
  writeFileSync(join(dir, INDEX_FILE), `${JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2)}\n`);
}

/**
 * A safetensors file written tensor by tensor as the tensors become available: the header
 * (every name, shape and offset) first, then each tensor in the planned order. Nothing but
 * the tensor being written is held.
 */
export class SafetensorsWriter {
  private next = 0;

  private constructor(
    readonly path: string,
    private fd: number | null,
    private readonly planned: PlannedTensor[],
  ) {}

  static create(path: string, planned: PlannedTensor[], metadata?: Record<string, string>): SafetensorsWriter {
    mkdirSync(dirname(path), { recursive: true });
    const fd = openSync(path, 'w');
    writeSync(fd, buildHeader(planned, metadata).bytes);
    return new SafetensorsWriter(path, fd, planned);
  }

  /** The name the next `write` must bring, or null when the file is complete. */
  get expecting(): string | null {
    return this.planned[this.next]?.name ?? null;
  }

  /** Writes the next planned tensor (names and shapes must follow the plan). */
  write(name: string, t: Tensor): void {
    const planned = this.planned[this.next];
    if (this.fd === null) throw new SafetensorsFormatError(`${this.path}: writer is closed`);
    if (!planned || planned.name !== name) throw new SafetensorsFormatError(`${this.path}: expected '${planned?.name ?? 'nothing'}', got '${name}'`);
    if (planned.shape.length !== t.ndim || planned.shape.some((d, i) => d !== t.shape[i])) {
      throw new SafetensorsFormatError(`${this.path}: '${name}' was planned as [${planned.shape}], got [${t.shape}]`);
    }
    const per = Math.floor(CHUNK_BYTES / SAFE_DTYPE_BYTES[planned.dtype]);
    for (let start = 0; start < t.size; start += per) {
      writeSync(this.fd, encodeChunk(t, planned.dtype, start, Math.min(per, t.size - start)));
    }
    this.next++;
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
    if (this.next < this.planned.length) throw new SafetensorsFormatError(`${this.path}: closed before '${this.planned[this.next].name}' was written`);
  }
}

/**
 * Writes `model.safetensors`, or, when the tensors exceed `maxShardBytes`, shards
 * `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json` (Hugging Face's layout).
 */
export function writeCheckpoint(
  dir: string,
  tensors: Map<string, Tensor>,
  options: WriteOptions & { maxShardBytes?: number } = {},
): string[] {
  const planned = [...tensors].map(([name, t]) => ({ name, shape: [...t.shape], dtype: storageType(t, options.dtype) }));
  const shards = planShards(planned, options.maxShardBytes);
  mkdirSync(dir, { recursive: true });
  for (const shard of shards) {
    writeSafetensors(join(dir, shard.file), new Map(shard.tensors.map((t) => [t.name, tensors.get(t.name)!])), options);
  }
  if (shards.length === 1) return [SINGLE_FILE];
  writeShardIndex(dir, shards);
  return [...shards.map((sh) => sh.file), INDEX_FILE];
}

/**
 * A checkpoint directory (single file or sharded with an index) read lazily:
 * `keys()` lists every tensor, `read(name)` opens the right shard.
 */
export class Checkpoint {
  private readonly readers = new Map<string, SafetensorsReader>();

  private constructor(
    readonly dir: string,
    private readonly files: Map<string, string>,
  ) {}

  static open(dir: string): Checkpoint {
    if (!existsSync(dir) || !statSync(dir).isDirectory())
      throw new FileNotFoundError(`no checkpoint directory at '${dir}'`);
    const indexPath = join(dir, INDEX_FILE);
    if (existsSync(indexPath)) {
      let index: { weight_map?: Record<string, unknown> };
      try {
        index = JSON.parse(readFileSync(indexPath, 'utf8'));
      } catch {
        throw new SafetensorsFormatError(`${indexPath}: not valid JSON`);
      }
      const map = index.weight_map;
      if (typeof map !== 'object' || map === null)
        throw new SafetensorsFormatError(`${indexPath}: no weight_map`);
      const fileOf = new Map<string, string>();
      for (const [k, v] of Object.entries(map)) {
        if (typeof v !== 'string' || v.includes('/') || v.includes('\\')) {
          throw new SafetensorsFormatError(`${indexPath}: bad shard name for '${k}'`);
        }
        fileOf.set(k, v);
      }
      return new Checkpoint(dir, fileOf);
    }
    const single = join(dir, SINGLE_FILE);
    if (!existsSync(single))
      throw new FileNotFoundError(`'${dir}' has neither ${SINGLE_FILE} nor ${INDEX_FILE}`);
    const reader = SafetensorsReader.open(single);
    const ckpt = new Checkpoint(dir, new Map(reader.keys().map((k) => [k, SINGLE_FILE])));
    ckpt.readers.set(SINGLE_FILE, reader);
    return ckpt;
  }

  keys(): string[] {
    return [...this.files.keys()];
  }

  private closed = false;

  private reader(name: string): SafetensorsReader {
    if (this.closed) throw new SafetensorsFormatError(`${this.dir}: checkpoint is closed`);
    const file = this.fileOf(name);
    let r = this.readers.get(file);
    if (r === undefined) {
      r = SafetensorsReader.open(join(this.dir, file));
      this.readers.set(file, r);
    }
    if (!r.has(name))
      throw new SafetensorsFormatError(`${file} does not hold '${name}' although the index says so`);
    return r;
  }

  info(name: string): { dtype: SafeDType; shape: number[]; byteLength: number } {
    return this.reader(name).info(name);
  }

  read(name: string): Tensor {
    return this.reader(name).read(name);
  }

  /** Elements [start, start + count) of a float tensor as float32 (see SafetensorsReader.readFloat32). */
  readFloat32(name: string, start: number, count: number, into?: Float32Array): Float32Array {
    return this.reader(name).readFloat32(name, start, count, into);
  }

  /** The file that holds a tensor (relative to the directory). */
  fileOf(name: string): string {
    const file = this.files.get(name);
    if (file === undefined) throw new SafetensorsFormatError(`${this.dir}: no tensor named '${name}'`);
    return file;
  }

  /** Reads every tensor (convenient for small models). */
  readAll(): Map<string, Tensor> {
    return new Map(this.keys().map((k) => [k, this.read(k)]));
  }

  close(): void {
    this.closed = true;
    for (const r of this.readers.values()) r.close();
    this.readers.clear();
  }
}

export type { SafeDType };
