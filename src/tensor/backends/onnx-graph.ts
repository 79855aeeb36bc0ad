/**
 * A minimal ONNX ModelProto encoder: just enough protobuf to describe the small
 * single-purpose graphs the ort backend runs (MatMul, Gemm, ...). Writing the
 * bytes ourselves avoids a protobuf dependency for a handful of messages.
 */

type Field = Uint8Array;

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

function concat(parts: Field[]): Uint8Array {
  let length = 0;
  for (const p of parts) length += p.length;
  const out = new Uint8Array(length);
  let offset = 0;
  for (const p of parts) {
    out.set(p, offset);
    offset += p.length;
  }
  return out;
}

function intField(field: number, value: number | bigint): Field {
  return Uint8Array.from([...varint(field << 3), ...varint(value)]);
}

function bytesField(field: number, bytes: Uint8Array): Field {
  return concat([Uint8Array.from([...varint((field << 3) | 2), ...varint(bytes.length)]), bytes]);
}

function stringField(field: number, value: string): Field {
  return bytesField(field, new TextEncoder().encode(value));
}

/** ONNX TensorProto.DataType codes for the element types we use. */
export const OnnxType = { float32: 1, int32: 6, int64: 7, float64: 11 } as const;

/** A graph input or output: its name, element type and shape (a string is a symbolic dim). */
export interface ValueInfo {
  name: string;
  type: number;
  shape: (number | string)[];
}

/** An attribute: an integer, a list of integers, a float ({ float: x }) or a string. */
export type AttributeValue = number | number[] | { float: number } | string;

/** One graph node. */
export interface NodeSpec {
  op: string;
  inputs: string[];
  outputs: string[];
  attributes?: Record<string, AttributeValue>;
}

function valueInfo(v: ValueInfo): Field {
  const dims = v.shape.map((d) => bytesField(1, typeof d === 'number' ? intField(1, d) : stringField(2, d)));
  const tensorType = concat([intField(1, v.type), bytesField(2, concat(dims))]);
  return concat([stringField(1, v.name), bytesField(2, bytesField(1, tensorType))]);
}

function floatField(field: number, value: number): Field {
  const bytes = new Uint8Array(5);
  bytes[0] = (field << 3) | 5;
  new DataView(bytes.buffer).setFloat32(1, value, true);
  return bytes;
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
  ]);
}

/** Encodes a single-graph ONNX model (IR version 8, default opset 17) as bytes. */
export function encodeModel(
  nodes: NodeSpec[],
  inputs: ValueInfo[],
  outputs: ValueInfo[],
  opset = 17,
): Uint8Array {
  const graph = concat([
    ...nodes.map((n, i) => bytesField(1, node(n, i))),
    stringField(2, 'tensorlink'),
    ...inputs.map((v) => bytesField(11, valueInfo(v))),
    ...outputs.map((v) => bytesField(12, valueInfo(v))),
  ]);
  const opsetId = concat([stringField(1, ''), intField(2, opset)]);
  return concat([intField(1, 8), stringField(2, 'tensorlink'), bytesField(7, graph), bytesField(8, opsetId)]);
}
