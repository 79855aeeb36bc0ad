import { createHash, type Hash } from 'node:crypto';
import type { Tensor } from '../tensor/index.ts';

/** The bytes of a typed array, without a copy. */
function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

function addTensor(h: Hash, t: Tensor): void {
  h.update(`${t.dtype}[${t.shape.join(',')}]`);
  if (t.packed) {
    // a compact weight is its packed bytes and scales, as it is held (its float32 buffer is empty)
    h.update(`${t.packed.format}:`);
    h.update(bytesOf(t.packed.data));
    h.update(bytesOf(t.packed.scales));
    return;
  }
  h.update(bytesOf(t.data as ArrayBufferView));
}

/**
 * The sha256 of tensors as a record names them: each tensor's dtype, shape and bytes, in
 * order. Two results hash equal exactly when they are bit for bit the same.
 */
export function hashTensors(tensors: readonly Tensor[]): string {
  const h = createHash('sha256');
  h.update(`${tensors.length}:`);
  for (const t of tensors) addTensor(h, t);
  return h.digest('hex');
}

/** The sha256 of named tensors (a section's weights, its gradients), in the order given. */
export function hashNamed(named: Iterable<readonly [string, Tensor | null]>): string {
  const h = createHash('sha256');
  for (const [name, t] of named) {
    h.update(`${name}=`);
    if (t) addTensor(h, t);
    else h.update('none;');
  }
  return h.digest('hex');
}

/**
 * The sha256 of raw float arrays with their names (optimizer moments, snapshots). An entry may be several arrays:
 * they hash as their concatenation would.
 */
export function hashArrays(named: Iterable<readonly [string, Float32Array | readonly Float32Array[] | null, number?]>): string {
  const h = createHash('sha256');
  for (const [name, a, step] of named) {
    h.update(`${name}@${step ?? -1}=`);
    if (!a) h.update('none;');
    else for (const part of a instanceof Float32Array ? [a] : a) h.update(bytesOf(part));
  }
  return h.digest('hex');
}
