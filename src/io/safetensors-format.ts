import { SafetensorsFormatError } from '../errors.ts';
import { sizeOf } from '../tensor/index.ts';

/**
 * The safetensors layout: an 8-byte little-endian header length, a JSON header
 * mapping names to {dtype, shape, data_offsets} (offsets relative to the data that
 * follows the header), an optional "__metadata__" of strings, then the raw bytes.
 * This module is pure: parsing and building headers, no I/O.
 */

export type SafeDType = 'F64' | 'F32' | 'F16' | 'BF16' | 'I64' | 'I32';

export const SAFE_DTYPE_BYTES: Record<SafeDType, number> = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  I32: 4,
};

/** Headers above this are refused (the format's reference implementation uses 100 MB). */
export const MAX_HEADER_BYTES = 100_000_000;

export interface TensorEntry {
  name: string;
  dtype: SafeDType;
  shape: number[];
  /** Absolute byte offsets in the file. */
  begin: number;
  end: number;
}

export interface ParsedHeader {
  entries: Map<string, TensorEntry>;
  metadata: Record<string, string>;
  /** Where the data section starts in the file. */
  dataStart: number;
}

function fail(where: string, message: string): never {
  throw new SafetensorsFormatError(`${where}: ${message}`);
}

/** Validates a header (JSON text) against the file size and returns its entries. */
export function parseHeader(
  json: string,
  headerLength: number,
  fileSize: number,
  where: string,
): ParsedHeader {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch {
    fail(where, 'header is not valid JSON');
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw))
    fail(where, 'header is not a JSON object');
  const dataStart = 8 + headerLength;
  const dataSize = fileSize - dataStart;
  const entries = new Map<string, TensorEntry>();
  let metadata: Record<string, string> = {};
  const spans: [number, number][] = [];
  for (const [name, value] of Object.entries(raw as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (typeof value !== 'object' || value === null)
        fail(where, '__metadata__ must be an object of strings');
      metadata = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, String(v)]));
      continue;
    }
    const v = value as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    if (typeof v !== 'object' || v === null) fail(where, `entry '${name}' is not an object`);
    const dtype = v.dtype as SafeDType;
    if (!(typeof dtype === 'string' && dtype in SAFE_DTYPE_BYTES)) {
      fail(
        where,
        `tensor '${name}' has dtype ${String(v.dtype)}; supported: ${Object.keys(SAFE_DTYPE_BYTES).join(', ')}`,
      );
    }
    const shape = v.shape;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) {
      fail(where, `tensor '${name}' has an invalid shape`);
    }
    const offsets = v.data_offsets;
    if (
      !Array.isArray(offsets)
      || offsets.length !== 2
      || !offsets.every((o) => Number.isInteger(o) && o >= 0)
    ) {
      fail(where, `tensor '${name}' has invalid data_offsets`);
    }
    const [b, e] = offsets as [number, number];
    const expected = sizeOf(shape as number[]) * SAFE_DTYPE_BYTES[dtype];
    if (e < b || e - b !== expected) {
      fail(where, `tensor '${name}' spans ${e - b} bytes but [${shape}] ${dtype} needs ${expected}`);
    }
    if (e > dataSize)
      fail(where, `tensor '${name}' ends at byte ${e}, past the end of the data (${dataSize})`);
    spans.push([b, e]);
    entries.set(name, { name, dtype, shape: shape as number[], begin: dataStart + b, end: dataStart + e });
  }
  spans.sort((p, q) => p[0] - q[0]);
  for (let i = 1; i < spans.length; i++) {
    if (spans[i][0] < spans[i - 1][1]) fail(where, 'tensor data regions overlap');
  }
  return { entries, metadata, dataStart };
}

/** Builds the header bytes (length prefix + JSON padded with spaces to 8 bytes). */
export function buildHeader(
  tensors: { name: string; dtype: SafeDType; shape: readonly number[] }[],
  metadata: Record<string, string> = {},
): { bytes: Uint8Array; dataBytes: number } {
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    const n = sizeOf(t.shape) * SAFE_DTYPE_BYTES[t.dtype];
    header[t.name] = { dtype: t.dtype, shape: [...t.shape], data_offsets: [offset, offset + n] };
    offset += n;
  }
  let json = JSON.stringify(header);
  const encoder = new TextEncoder();
  while ((encoder.encode(json).length + 8) % 8 !== 0) json += ' ';
  const body = encoder.encode(json);
  const bytes = new Uint8Array(8 + body.length);
  new DataView(bytes.buffer).setBigUint64(0, BigInt(body.length), true);
  bytes.set(body, 8);
  return { bytes, dataBytes: offset };
}
