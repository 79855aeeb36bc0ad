import { InvalidArgumentError } from '../../../errors.ts';

/**
 * A minimal ONNX ModelProto encoder: just enough protobuf to describe the small
 * single-purpose graphs the ort backend runs (MatMul, Gemm, MatMulNBits, ...). Writing the
 * bytes ourselves avoids a protobuf dependency for a handful of messages.
 *
 * The fields written (onnx.proto): ModelProto ir_version=1, producer_name=2, graph=7,
 * opset_import=8 (OperatorSetIdProto domain=1, version=2); GraphProto node=1, name=2,
 * initializer=5, input=11, output=12; NodeProto input=1, output=2, name=3, op_type=4,
 * attribute=5, domain=7; TensorProto dims=1, data_type=2, name=8, raw_data=9 (little-endian).
 */
/**
 * Encoded bytes as a list of pieces, joined once at the end: an initializer's megabytes are copied once, not again
 * at every level of nesting.
 */
interface Field {
  readonly parts: readonly Uint8Array[];
  readonly length: number;
}

function varint(value: number | bigint): number[] {
  let v = BigInt(value);
  if (v < 0n) v += 1n << 64n;
  const out: number[] = [];
  do {
    let byte = Number(v & 0x7fn);
    v >>= 7n;
    if (v !== 0n) byte |= 0x80;
    out.push(byte);
  } while (v !== 0n);
  return out;
}

function concat(fields: Field[]): Field {
  const parts: Uint8Array[] = [];
  let length = 0;
  for (const f of fields) {
    for (const p of f.parts) parts.push(p);
    length += f.length;
  }
  return { parts, length };
}

const piece = (bytes: Uint8Array): Field => ({ parts: [bytes], length: bytes.length });

/** The pieces joined into one buffer. */
function join(f: Field): Uint8Array {
  const out = new Uint8Array(f.length);
  let offset = 0;
  for (const p of f.parts) {
    out.set(p, offset);
    offset += p.length;
  }
  return out;
}

function intField(field: number, value: number | bigint): Field {
  return piece(Uint8Array.from([...varint(field << 3), ...varint(value)]));
}

function bytesField(field: number, bytes: Field): Field {
  return concat([piece(Uint8Array.from([...varint((field << 3) | 2), ...varint(bytes.length)])), bytes]);
}

function stringField(field: number, value: string): Field {
  return bytesField(field, piece(new TextEncoder().encode(value)));
}

/** ONNX TensorProto.DataType codes for the element types we use. */
export const OnnxType = { float32: 1, uint8: 2, int32: 6, int64: 7, bool: 9, float16: 10, float64: 11 } as const;

/** A graph input or output: its name, element type and shape (a string is a symbolic dim; null: not stated). */
export interface ValueInfo {
  name: string;
  type: number;
  shape: (number | string)[] | null;
}

/** An attribute: an integer, a list of integers, a float ({ float: x }) or a string. */
export type AttributeValue = number | number[] | { float: number } | string;

/** One graph node. */
export interface NodeSpec {
  op: string;
  inputs: string[];
  outputs: string[];
  attributes?: Record<string, AttributeValue>;
  /** The operator set the op comes from (default: ONNX's own, ''), e.g. 'com.microsoft'. */
  domain?: string;
}

/** A constant tensor stored in the graph: uint8 bytes, float32, int32 or int64 values, row-major in `dims`. */
export interface Initializer {
  name: string;
  dims: readonly number[];
  data: Uint8Array | Float32Array | Int32Array | BigInt64Array;
}

/** What a graph needs beyond its nodes: constants, and operator sets other than ONNX's (domain → version). */
export interface ModelExtras {
  initializers?: readonly Initializer[];
  opsets?: Readonly<Record<string, number>>;
}

function valueInfo(v: ValueInfo): Field {
  const dims = (v.shape ?? []).map((d) => bytesField(1, typeof d === 'number' ? intField(1, d) : stringField(2, d)));
  const tensorType = concat([intField(1, v.type), ...(v.shape === null ? [] : [bytesField(2, concat(dims))])]);
  return concat([stringField(1, v.name), bytesField(2, bytesField(1, tensorType))]);
}

function floatField(field: number, value: number): Field {
  const bytes = new Uint8Array(5);
  bytes[0] = (field << 3) | 5;
  new DataView(bytes.buffer).setFloat32(1, value, true);
  return piece(bytes);
}

function attribute(name: string, value: AttributeValue): Field {
  // AttributeProto: name=1, f=2, i=3, s=4, ints=8, type=20 (FLOAT=1, INT=2, STRING=3, INTS=7)
  if (typeof value === 'string')
    return concat([stringField(1, name), stringField(4, value), intField(20, 3)]);
  if (typeof value === 'object' && !Array.isArray(value)) {
    return concat([stringField(1, name), floatField(2, value.float), intField(20, 1)]);
  }
  if (Array.isArray(value)) {
    return concat([stringField(1, name), ...value.map((x) => intField(8, x)), intField(20, 7)]);
  }
  return concat([stringField(1, name), intField(3, value), intField(20, 2)]);
}

function node(n: NodeSpec, index: number): Field {
  const attrs = Object.entries(n.attributes ?? {}).map(([k, v]) => bytesField(5, attribute(k, v)));
  return concat([
    ...n.inputs.map((s) => stringField(1, s)),
    ...n.outputs.map((s) => stringField(2, s)),
    stringField(3, `n${index}`),
    stringField(4, n.op),
    ...attrs,
    ...(n.domain ? [stringField(7, n.domain)] : []),
  ]);
}

const LITTLE_ENDIAN = new Uint8Array(Uint16Array.of(1).buffer)[0] === 1;

/** Little-endian bytes of an initializer's values (the values' own bytes where the platform is little-endian). */
function littleEndianBytes(values: Float32Array | Int32Array | BigInt64Array): Uint8Array {
  if (LITTLE_ENDIAN) return new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  const bytes = new Uint8Array(values.byteLength);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < values.length; i++) {
    if (values instanceof Float32Array) view.setFloat32(4 * i, values[i], true);
    else if (values instanceof Int32Array) view.setInt32(4 * i, values[i], true);
    else view.setBigInt64(8 * i, values[i], true);
  }
  return bytes;
}

function elementType(data: Initializer['data']): number {
  if (data instanceof Float32Array) return OnnxType.float32;
  if (data instanceof Int32Array) return OnnxType.int32;
  if (data instanceof BigInt64Array) return OnnxType.int64;
  return OnnxType.uint8;
}

function tensor(t: Initializer): Field {
  const count = t.dims.reduce((a, d) => a * d, 1);
  if (count !== t.data.length) throw new InvalidArgumentError(`initializer '${t.name}': ${t.data.length} values do not fit [${t.dims}]`);
  return concat([
    ...t.dims.map((d) => intField(1, d)),
    intField(2, elementType(t.data)),
    stringField(8, t.name),
    bytesField(9, piece(t.data instanceof Uint8Array ? t.data : littleEndianBytes(t.data))),
  ]);
}

/** Encodes a single-graph ONNX model (IR version 8, default opset 17) as bytes. */
export function encodeModel(
  nodes: NodeSpec[],
  inputs: ValueInfo[],
  outputs: ValueInfo[],
  opset = 17,
  extras: ModelExtras = {},
): Uint8Array {
  const graph = concat([
    ...nodes.map((n, i) => bytesField(1, node(n, i))),
    stringField(2, 'tensorlink'),
    ...(extras.initializers ?? []).map((t) => bytesField(5, tensor(t))),
    ...inputs.map((v) => bytesField(11, valueInfo(v))),
    ...outputs.map((v) => bytesField(12, valueInfo(v))),
  ]);
  const opsetId = (domain: string, version: number) => bytesField(8, concat([stringField(1, domain), intField(2, version)]));
  const extraOpsets = Object.entries(extras.opsets ?? {}).map(([domain, version]) => opsetId(domain, version));
  return join(concat([intField(1, 8), stringField(2, 'tensorlink'), bytesField(7, graph), opsetId('', opset), ...extraOpsets]));
}
