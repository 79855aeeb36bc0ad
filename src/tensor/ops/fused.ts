import { isGradEnabled } from '../autograd.ts';
import type { LinearWeight } from '../backends/backend.ts';
import { getBackend } from '../backends/select.ts';
import { Tensor } from '../tensor.ts';
import { hook, hooked } from '../dispatch.ts';
import { linear } from './matmul.ts';

/**
 * Products fused into one backend call where the backend has one (ort: one onnxruntime run for a block's q, k and v
 * projections, one for a SwiGLU MLP), for decoding: each native call costs a few µs of crossing and js work around
 * it, and a token of a 16-block model made ~130 of them. Without gradients only; otherwise, and on a backend without
 * them (js), they are the ops they stand for, so js results are exactly those ops'.
 */

/** A linear layer's parameters: y = x · weightᵀ + bias. */
export interface LinearParams {
  readonly weight: Tensor;
  readonly bias: Tensor | null;
}

/** The weight as a backend's fused products take it, or null where it is not a float32 or compact matrix. */
function operand(w: Tensor): LinearWeight | null {
  if (w.packed !== null) return { rows: w.packed.rows, cols: w.packed.cols, values: null, packed: w.packed };
  if (w.ndim !== 2 || !(w.data instanceof Float32Array)) return null;
  return { rows: w.shape[0], cols: w.shape[1], values: w.data, packed: null };
}

/** The operands of layers that take x [..., k], or null where one does not fit or a gradient is wanted. */
function operands(x: Tensor, layers: readonly LinearParams[]): LinearWeight[] | null {
  if (x.dtype !== 'float32' || x.ndim < 1) return null;
  if (isGradEnabled() && (x.requiresGrad || layers.some((l) => l.weight.requiresGrad || l.bias?.requiresGrad))) return null;
  const k = x.shape[x.ndim - 1];
  const ws: LinearWeight[] = [];
  for (const l of layers) {
    const w = operand(l.weight);
    if (w === null || w.cols !== k || (l.bias !== null && (l.bias.size !== w.rows || l.bias.dtype !== 'float32'))) return null;
    ws.push(w);
  }
  return ws;
}

function output(x: Tensor, y: Float32Array, rows: number, bias: Tensor | null): Tensor {
  if (bias !== null) {
    const b = bias.data;
    for (let r = 0; r < y.length; r += rows) for (let j = 0; j < rows; j++) y[r + j] += b[j];
  }
  return new Tensor(y, [...x.shape.slice(0, -1), rows]);
}

/** linear(x, weight, bias) for each layer, all of which take x. */
export function linears(x: Tensor, layers: readonly LinearParams[]): Tensor[] {
  if (hooked) return hook('linears', linears, [x, layers]);
  const backend = getBackend();
  const ws = backend.linears ? operands(x, layers) : null;
  if (ws !== null && ws.length > 0) {
    const m = x.size / ws[0].cols;
    const ys = ws.map((w) => new Float32Array(m * w.rows));
    if (backend.linears!(x.data as Float32Array, m, ws, ys)) return ys.map((y, i) => output(x, y, ws[i].rows, layers[i].bias));
  }
  return layers.map((l) => linear(x, l.weight, l.bias));
}

/** A SwiGLU MLP: down(silu(gate(x)) ⊙ up(x)). */
export function gatedMlp(x: Tensor, gate: LinearParams, up: LinearParams, down: LinearParams): Tensor {
  if (hooked) return hook('gatedMlp', gatedMlp, [x, gate, up, down]);
  const backend = getBackend();
  const plain = gate.bias === null && up.bias === null && down.bias === null;
  const ws = backend.gatedMlp && plain ? operands(x, [gate, up]) : null;
  const wd = ws !== null ? operand(down.weight) : null;
  if (ws !== null && wd !== null && wd.cols === ws[0].rows && ws[1].rows === ws[0].rows && !(isGradEnabled() && down.weight.requiresGrad)) {
    const m = x.size / ws[0].cols;
    const y = new Float32Array(m * wd.rows);
    if (backend.gatedMlp!(x.data as Float32Array, m, ws[0], ws[1], wd, y)) return output(x, y, wd.rows, null);
  }
  return linear(linear(x, gate.weight, gate.bias).silu().mul(linear(x, up.weight, up.bias)), down.weight, down.bias);
}
