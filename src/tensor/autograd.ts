import { AutogradError } from '../errors.ts';
import type { FloatArray } from './dtype.ts';
import { addInto } from './kernels/rows.ts';
import { releaseFloat32 } from './pool.ts';
import type { Tensor } from './tensor.ts';

/**
 * Reverse-mode autograd. Every differentiable op records one node on its output:
 * the inputs and a vector-Jacobian product that maps the output's gradient to one
 * gradient per input (null where an input needs none). `backward` walks the graph
 * once in reverse topological order and, unless asked to keep it, frees each node's
 * saved tensors as soon as they have been used.
 */
export type VjpFn = (grad: Tensor) => (Tensor | null)[];

export interface GradNode {
  readonly op: string;
  readonly inputs: readonly Tensor[];
  vjp: VjpFn | null;
}

let gradEnabled = true;

export function isGradEnabled(): boolean {
  return gradEnabled;
}

/** Runs `fn` without recording a graph (inference, optimizer steps, gradient math). */
export function noGrad<T>(fn: () => T): T {
  const previous = gradEnabled;
  gradEnabled = false;
  try {
    return fn();
  } finally {
    gradEnabled = previous;
  }
}

/** Attaches a node to `out` when gradients are on and some input needs one. */
export function record(out: Tensor, op: string, inputs: readonly Tensor[], vjp: VjpFn): Tensor {
  if (gradEnabled && inputs.some((t) => t.requiresGrad)) {
    out.node = { op, inputs, vjp };
    out.setRequiresGradUnchecked(true);
  }
  return out;
}

function topologicalOrder(root: Tensor): Tensor[] {
  const order: Tensor[] = [];
  const visited = new Set<Tensor>();
  const stack: [Tensor, number][] = [[root, 0]];
  visited.add(root);
  while (stack.length > 0) {
    const top = stack[stack.length - 1];
    const [t, i] = top;
    const inputs = t.node?.inputs ?? [];
    if (i < inputs.length) {
      top[1]++;
      const child = inputs[i];
      if (child.requiresGrad && !visited.has(child)) {
        visited.add(child);
        stack.push([child, 0]);
      }
    } else {
      order.push(t);
      stack.pop();
    }
  }
  return order.reverse();
}

export interface BackwardOptions {
  /** Keep the graph's saved tensors so that backward can run through it again. */
  retainGraph?: boolean;
  /**
   * Return the buffers of intermediate results to the allocator once the backward pass is
   * done with them, so the next step reuses memory instead of touching fresh pages. Only for
   * callers that hold no intermediate tensor of the graph (a training loop that keeps just
   * the loss); the root, the leaves and tensors outside the graph are never touched.
   */
  releaseActivations?: boolean;
}

/** How many graph tensors use each buffer (views share one), for releaseActivations. */
function bufferUses(order: readonly Tensor[]): Map<ArrayBufferLike, number> {
  const uses = new Map<ArrayBufferLike, number>();
  const seen = new Set<Tensor>();
  const count = (t: Tensor) => {
    if (seen.has(t)) return;
    seen.add(t);
    uses.set(t.data.buffer, (uses.get(t.data.buffer) ?? 0) + 1);
  };
  for (const t of order) {
    count(t);
    for (const input of t.node?.inputs ?? []) count(input);
  }
  return uses;
}

/**
 * Accumulates d(root)/d(leaf) into `leaf.grad` for every leaf that requires a gradient.
 * `grad` defaults to 1 for a scalar root.
 */
export function runBackward(root: Tensor, grad: Tensor, options: BackwardOptions = {}): void {
  if (!root.requiresGrad) {
    throw new AutogradError('backward() on a tensor that does not require grad (no graph was recorded)');
  }
  if (root.deviceStorage !== null) return runDeviceBackward(root, grad, options);
  const order = topologicalOrder(root);
  const grads = new Map<Tensor, Tensor>([[root, grad]]);
  const uses = options.releaseActivations && !options.retainGraph ? bufferUses(order) : null;
  const pinned = new Set<ArrayBufferLike>([root.data.buffer]);
  if (uses) {
    for (const t of order) {
      if (t.node === null) pinned.add(t.data.buffer);
      for (const input of t.node?.inputs ?? []) if (input.node === null || !input.requiresGrad) pinned.add(input.data.buffer);
    }
  }
  /** Buffers handed to the pool during this pass (the pool may give them out again at once). */
  const released = new Set<ArrayBufferLike>();
  const release = (data: Float32Array) => {
    released.add(data.buffer);
    releaseFloat32(data);
  };
  /** After a node's backward: its output buffer is released when no remaining graph tensor uses it. */
  const releaseOutput = (t: Tensor) => {
    if (!uses) return;
    const buffer = t.data.buffer;
    const left = (uses.get(buffer) ?? 1) - 1;
    uses.set(buffer, left);
    if (left === 0 && !pinned.has(buffer) && t.data instanceof Float32Array && !sharedWithPending(buffer)) {
      release(t.data);
    }
  };
  // Buffers this pass allocated to sum contributions and that nothing else holds yet:
  // further contributions are added in place. Buffers handed to leaves are taken over
  // (no copy) when no pending gradient shares them.
  const owned = new Set<ArrayBufferLike>();
  const adopted = new Set<ArrayBufferLike>([grad.data.buffer]);
  const sharedWithPending = (buffer: ArrayBufferLike) => {
    for (const v of grads.values()) if (v.data.buffer === buffer) return true;
    return false;
  };
  /** Hands a consumed gradient's buffer to the pool when nothing else can reach it. */
  const recycle = (g: Tensor, keep: readonly (Tensor | null | undefined)[] = []) => {
    const buffer = g.data.buffer;
    if (!(g.data instanceof Float32Array) || adopted.has(buffer) || sharedWithPending(buffer)) return;
    if (keep.some((k) => k?.data.buffer === buffer)) return;
    release(g.data);
  };
  const previous = gradEnabled;
  gradEnabled = false;
  try {
    for (const t of order) {
      const g = grads.get(t);
      grads.delete(t);
      if (g === undefined) continue;
      owned.delete(g.data.buffer);
      const node = t.node;
      if (node === null) {
        const buffer = g.data.buffer;
        const adopt = t.grad === null && !adopted.has(buffer) && !sharedWithPending(buffer);
        t.accumulateGrad(g, adopt);
        if (adopt) adopted.add(buffer);
        else recycle(g);
        continue;
      }
      const inputGrads = runVjp(node, g, options);
      if (g !== grad) recycle(g, inputGrads);
      if (t !== root) releaseOutput(t);
      node.inputs.forEach((input, i) => {
        const ig = inputGrads[i];
        if (ig === null || ig === undefined || !input.requiresGrad) return;
        const prev = grads.get(input);
        // A gradient consumed here may still be handed to a later input of this node.
        const later = inputGrads.slice(i + 1);
        if (prev === undefined) {
          grads.set(input, ig);
        } else if (owned.has(prev.data.buffer)) {
          addInto(prev.data as FloatArray, ig.data);
          recycle(ig, later);
        } else {
          const sum = prev.add(ig);
          owned.add(sum.data.buffer);
          grads.set(input, sum);
          recycle(prev, later);
          recycle(ig, later);
        }
      });
    }
    // Intermediates that no gradient reached (outputs off the gradient's path, inputs kept
    // only for a backward that never ran) are as dead as the rest once the pass is over.
    if (uses) {
      for (const t of order) {
        for (const x of [t, ...(t.node?.inputs ?? [])]) {
          const buffer = x.data.buffer;
          if (!(x.data instanceof Float32Array) || x === root || released.has(buffer)) continue;
          if (!pinned.has(buffer) && !adopted.has(buffer)) release(x.data);
        }
      }
    }
  } finally {
    gradEnabled = previous;
  }
}

/** A node's vector-Jacobian product on `g`, freeing it unless the graph is kept. */
function runVjp(node: GradNode, g: Tensor, options: BackwardOptions): (Tensor | null)[] {
  if (node.vjp === null) {
    throw new AutogradError(`the graph through '${node.op}' was already freed by an earlier backward(); pass { retainGraph: true } to keep it`);
  }
  const inputGrads = node.vjp(g);
  if (!options.retainGraph) node.vjp = null;
  return inputGrads;
}

/**
 * Backward through a graph of tensors on a device (their nodes' products run there: webgpu records one per op, its
 * call's lowering differentiated): gradients are summed with the device's own `add`, and the host's buffer reuse
 * (releaseActivations) does not apply, as the device's allocator owns that memory.
 */
/** a + b on their device's backend (inside backward, an op of its own, nested ops do not dispatch by device). */
function deviceAdd(a: Tensor, b: Tensor): Tensor {
  const sum = a.deviceStorage?.backend.runOp?.('add', [a, b]);
  if (sum === undefined) throw new AutogradError(`gradients on '${a.device}' cannot be summed there (its backend has no 'add')`);
  return sum as Tensor;
}

function runDeviceBackward(root: Tensor, grad: Tensor, options: BackwardOptions): void {
  const order = topologicalOrder(root);
  const grads = new Map<Tensor, Tensor>([[root, grad]]);
  const previous = gradEnabled;
  gradEnabled = false;
  try {
    // device memory is freed as soon as a gradient is used up (not when it is collected): never the caller's `grad`
    const release = (x: Tensor) => {
      if (x !== grad) x.dispose();
    };
    for (const t of order) {
      const g = grads.get(t);
      grads.delete(t);
      if (g === undefined) continue;
      if (t.node === null) {
        if (t.grad === null) t.grad = g;
        else {
          const sum = deviceAdd(t.grad, g);
          release(t.grad);
          release(g);
          t.grad = sum;
        }
        continue;
      }
      const inputGrads = runVjp(t.node, g, options);
      release(g);
      t.node.inputs.forEach((input, i) => {
        const ig = inputGrads[i];
        if (ig === null || ig === undefined || !input.requiresGrad) return;
        const prev = grads.get(input);
        if (prev === undefined) grads.set(input, ig);
        else {
          grads.set(input, deviceAdd(prev, ig));
          release(prev);
          release(ig);
        }
      });
    }
  } finally {
    gradEnabled = previous;
  }
}
