import type { GraphBuilder } from './builder.ts';
import { ELEMENTWISE } from './lowerings/elementwise.ts';
import { MODEL_OPS } from './lowerings/model-ops.ts';
import { PRODUCTS } from './lowerings/products.ts';
import { REDUCTIONS } from './lowerings/reductions.ts';
import { SHAPES } from './lowerings/shapes.ts';

/**
 * A lowering: how one public op of the engine (by its name in the trace, dispatch.ts) is
 * written as ONNX nodes. It is called with the op's arguments as the op was called, each
 * tensor replaced by a GraphValue (in arrays and plain objects too; the rest as given), adds
 * nodes to `g`, and returns what the op returns with GraphValues in place of tensors. It
 * computes what the op computes, to the backend's tolerance, and throws CannotLower
 * (`refuse`) for a call it cannot express. One table serves a whole traced step compiled as
 * one graph (step-graph.ts) and a device backend's single ops (runOp).
 */
export type Lowering = (g: GraphBuilder, ...args: unknown[]) => unknown;

export type LoweringTable = Readonly<Record<string, Lowering>>;

const table = new Map<string, Lowering>();
for (const group of [ELEMENTWISE, SHAPES, REDUCTIONS, PRODUCTS, MODEL_OPS]) {
  for (const [op, lower] of Object.entries(group)) {
    if (table.has(op)) throw new Error(`op '${op}' has two lowerings`);
    table.set(op, lower);
  }
}

/** The lowering of a public op, if it has one. */
export function loweringOf(op: string): Lowering | undefined {
  return table.get(op);
}

/** The ops that have a lowering, sorted. */
export function loweredOps(): string[] {
  return [...table.keys()].sort();
}
