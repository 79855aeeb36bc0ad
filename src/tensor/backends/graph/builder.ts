import type { DType } from '../../dtype.ts';
import type { Tensor } from '../../tensor.ts';
import type { AttributeValue, Initializer, NodeSpec } from '../ort/onnx-graph.ts';
import { OnnxType } from '../ort/onnx-graph.ts';

/**
 * What a lowering (lowerings.ts) writes into: the ONNX graph of a traced step or of one op
 * call. Every value carries its static shape and element type, so that a lowering can read
 * its inputs' shapes and state its outputs'; the step's compiler checks each result's shape
 * against the shape the trace recorded, so a lowering that gets a shape wrong is caught when
 * the step is compiled, not by a wrong number later.
 */

/** The element types of graph values: the engine's, and the ones ONNX ops take or make on the way (shapes, masks). */
export type ValueType = DType | 'int64' | 'bool';

export const ONNX_TYPE: Readonly<Record<ValueType, number>> = {
  float32: OnnxType.float32,
  float64: OnnxType.float64,
  int32: OnnxType.int32,
  int64: OnnxType.int64,
  bool: OnnxType.bool,
};

/**
 * One value of the graph: its name, static shape and type. A value the engine holds as a
 * tensor (a step's constant: a parameter, a mask) keeps it in `tensor`, so a lowering can
 * read what is not in the graph (a compact weight's packed bytes).
 */
export class GraphValue {
  constructor(
    readonly name: string,
    readonly shape: readonly number[],
    readonly type: ValueType,
    readonly tensor: Tensor | null = null,
  ) {}

  get rank(): number {
    return this.shape.length;
  }

  get size(): number {
    return this.shape.reduce((a, d) => a * d, 1);
  }
}

/** A value's shape and type, as a node's output is declared. */
export interface ValueSpec {
  shape: readonly number[];
  type: ValueType;
}

/** A lowering could not express a call (an op without a lowering, an argument it cannot take): the caller runs it another way. */
export class CannotLower extends Error {
  override name = 'CannotLower';
}

/** Thrown by lowerings: the call cannot be expressed as a graph; the step replays op by op instead. */
export function refuse(why: string): never {
  throw new CannotLower(why);
}

export class GraphBuilder {
  readonly nodes: NodeSpec[] = [];
  readonly initializers: Initializer[] = [];
  /** Operator sets other than ONNX's that nodes use (domain → version). */
  readonly opsets: Record<string, number> = {};
  /** Every value the graph knows by name (nodes' outputs, constants, and inputs told with `know`), for gradients.ts. */
  readonly values = new Map<string, GraphValue>();
  private count = 0;

  /** Tells the builder of values made outside it (the graph's inputs); returns them. */
  know<T extends GraphValue>(v: T): T {
    this.values.set(v.name, v);
    return v;
  }

  /** The data of a constant (initializer) named `name`, if it is one. */
  constantData(name: string): Float32Array | Int32Array | BigInt64Array | Uint8Array | undefined {
    return this.initializers.find((i) => i.name === name)?.data;
  }

  /** A fresh value name. */
  fresh(prefix = 'v'): string {
    return `${prefix}${this.count++}`;
  }

  /**
   * Adds one node with one output of the given shape and type (default: those of its first
   * input); null inputs are ONNX's omitted optional inputs.
   * @example
   * const y = g.node('Add', [a, b], { shape: a.shape, type: a.type })
   */
  node(
    op: string,
    inputs: readonly (GraphValue | null)[],
    out?: Partial<ValueSpec>,
    attributes?: Record<string, AttributeValue>,
    domain?: string,
  ): GraphValue {
    const first = inputs.find((v): v is GraphValue => v !== null);
    const spec = { shape: out?.shape ?? first?.shape ?? [], type: out?.type ?? first?.type ?? 'float32' };
    return this.multi(op, inputs, [spec], attributes, domain)[0];
  }

  /** Adds one node with several outputs. */
  multi(
    op: string,
    inputs: readonly (GraphValue | null)[],
    outs: readonly ValueSpec[],
    attributes?: Record<string, AttributeValue>,
    domain?: string,
  ): GraphValue[] {
    const values = outs.map((o) => this.know(new GraphValue(this.fresh(), [...o.shape], o.type)));
    this.nodes.push({ op, inputs: inputs.map((v) => v?.name ?? ''), outputs: values.map((v) => v.name), attributes, domain });
    if (domain !== undefined && domain !== '' && this.opsets[domain] === undefined) this.opsets[domain] = 1;
    return values;
  }

  /** A constant tensor in the graph (an initializer). */
  constant(values: Float32Array | Int32Array | BigInt64Array | Uint8Array, shape: readonly number[], type: ValueType): GraphValue {
    const v = this.know(new GraphValue(this.fresh('k'), [...shape], type));
    this.initializers.push({ name: v.name, dims: [...shape], data: values });
    return v;
  }

  /** A float32 scalar (shape []): broadcasts against anything. */
  scalar(x: number, type: ValueType = 'float32'): GraphValue {
    if (type === 'int32') return this.constant(Int32Array.of(x), [], 'int32');
    if (type === 'int64') return this.constant(BigInt64Array.of(BigInt(x)), [], 'int64');
    return this.constant(Float32Array.of(x), [], 'float32');
  }

  /** A 1-D int64 constant: the shapes, axes, starts and ends ONNX ops take. */
  ints(values: readonly number[]): GraphValue {
    return this.constant(BigInt64Array.from(values, (x) => BigInt(x)), [values.length], 'int64');
  }

  /** `x` with a new shape (same element count). */
  reshape(x: GraphValue, shape: readonly number[]): GraphValue {
    if (x.shape.length === shape.length && x.shape.every((d, i) => d === shape[i])) return x;
    return this.node('Reshape', [x, this.ints(shape)], { shape, type: x.type });
  }

  /** `x` cast to `type`. */
  cast(x: GraphValue, type: ValueType): GraphValue {
    if (x.type === type) return x;
    return this.node('Cast', [x], { shape: x.shape, type }, { to: ONNX_TYPE[type] });
  }
}
