import { type GraphBuilder, GraphValue, refuse } from '../builder.ts';
import type { LoweringTable } from '../lowerings.ts';
import { broadcast } from './common.ts';

/** Elementwise ops: add, sub, mul, div, pow, the unary functions, maskedFill, cast, clone, detach. */

function binary(op: string) {
  return (g: GraphBuilder, a: unknown, b: unknown): GraphValue => {
    const [x, y] = operands(g, a, b);
    return g.node(op, [x, y], { shape: broadcast(x.shape, y.shape), type: x.type });
  };
}

/** Both operands as graph values (a number becomes a scalar of the other's type). */
function operands(g: GraphBuilder, a: unknown, b: unknown): [GraphValue, GraphValue] {
  if (a instanceof GraphValue && b instanceof GraphValue) return [a, b];
  if (a instanceof GraphValue && typeof b === 'number') return [a, g.scalar(b, a.type)];
  if (typeof a === 'number' && b instanceof GraphValue) return [g.scalar(a, b.type), b];
  return refuse('a binary op of two numbers');
}

export const ELEMENTWISE: LoweringTable = {
  add: binary('Add'),
  sub: binary('Sub'),
  mul: binary('Mul'),
  div: binary('Div'),
};
