/**
 * The fuzz bench's frames: a protocol's well-formed frames (a `Corpus`) and mutations of them that no schema takes.
 */
import { encodeControl, encodeTensor } from '../src/p2p/index.ts';
import { Generator } from '../src/tensor/index.ts';
import { concat } from '../test/helpers/bytes.ts';

/** Values no schema takes for any field (wrong type, negative, huge, deep, prototype names). */
const BAD: unknown[] = [
  null, -1, -0.5, 1e308, Number.MAX_SAFE_INTEGER + 2, '', 'x'.repeat(5_000), [[[[[]]]]], { a: { b: { c: {} } } }, true, ['a'.repeat(600)],
  [1, 2, 3], { constructor: 1 }, '__proto__', '../../etc/passwd', '\u0000', Array.from({ length: 2_000 }, (_, i) => i),
];

export const floats = (shape: number[], id = 0) => encodeTensor({ requestId: id, dtype: 'float32', shape, bytes: new Uint8Array(4 * shape.reduce((a, b) => a * b, 1)) });

/** A protocol's well-formed frames: control messages (objects) and tensor frames, each one frame. */
export interface Corpus {
  messages: Record<string, unknown>[];
  tensors: Uint8Array[];
}

/** Replaces, removes or adds one field somewhere in `v` (a copy), or replaces `v` itself. */
export function mutateValue(v: unknown, rng: Generator, depth = 0): unknown {
  const pick = <T>(xs: readonly T[]) => xs[rng.int(xs.length)];
  if (v === null || typeof v !== 'object' || depth > 4 || rng.int(4) === 0) return pick(BAD);
  if (Array.isArray(v)) {
    if (v.length === 0 || rng.int(3) === 0) return [...v, pick(BAD)];
    const copy = [...v];
    copy[rng.int(copy.length)] = mutateValue(copy[rng.int(copy.length)], rng, depth + 1);
    return copy;
  }
  const copy: Record<string, unknown> = { ...(v as Record<string, unknown>) };
  const keys = Object.keys(copy);
  const op = rng.int(4);
  if (op === 0 || keys.length === 0) copy[pick(['x', 'type', 'id', 'jobId', 'tensors', 'constructor', 'sessionId'])] = pick(BAD);
  else if (op === 1) delete copy[pick(keys)];
  else {
    const k = pick(keys);
    copy[k] = mutateValue(copy[k], rng, depth + 1);
  }
  return copy;
}

/**
 * One fuzzed frame of `corpus`, as bytes to write, and whether it breaks the stream's framing (cut short, a length or
 * body that does not decode): the receiver resets the stream there, so such a frame is the last its stream carries.
 */
export function fuzzFrame(corpus: Corpus, rng: Generator, id: number): Fuzzed {
  const framed = (bytes: Uint8Array): Fuzzed => ({ bytes, breaks: false });
  const broken = (bytes: Uint8Array): Fuzzed => ({ bytes, breaks: true });
  const pick = <T>(xs: readonly T[]) => xs[rng.int(xs.length)];
  const valid = () => {
    return corpus.tensors.length > 0 && rng.int(5) === 0 ? pick(corpus.tensors) : encodeControl({ ...pick(corpus.messages), id });
  };
  const kind = rng.int(40);
  if (kind < 4) return framed(valid());
  if (kind < 28) {
    const m = mutateValue({ ...pick(corpus.messages), id }, rng);
    try {
      return framed(encodeControl(m));
    } catch {
      return framed(encodeControl({ id, pad: 'x' }));
    }
  }
  if (kind < 31) {
    const bytes = Uint8Array.from(valid());
    for (let flips = 1 + rng.int(4); flips > 0; flips--) bytes[4 + rng.int(Math.max(1, bytes.length - 4))] ^= 1 << rng.int(8);
    return broken(bytes);
  }
  if (kind < 33) {
    const bytes = valid();
    return broken(bytes.subarray(0, 1 + rng.int(bytes.length - 1)));
  }
  if (kind < 34) {
    const bytes = Uint8Array.from(valid());
    new DataView(bytes.buffer).setUint32(0, pick([0, 1, 0xffffffff, bytes.length * 2, rng.int(1 << 30)]), true);
    return broken(bytes);
  }
  if (kind < 38) {
    const dtypes = ['float32', 'float64', 'int32', 'float16', 'bfloat16', 'int8', 'uint8'] as const;
    const shape = Array.from({ length: rng.int(6) }, () => rng.int(5));
    const dtype = pick(dtypes);
    const width = { float32: 4, float64: 8, int32: 4, float16: 2, bfloat16: 2, int8: 1, uint8: 1 }[dtype];
    const size = shape.reduce((a, b) => a * b, 1);
    try {
      return framed(concat(encodeTensor({ requestId: rng.int(1 << 20), dtype, shape, bytes: new Uint8Array(size * width) })));
    } catch {
      return framed(concat(floats([1])));
    }
  }
  return broken(Uint8Array.from({ length: 1 + rng.int(64) }, () => rng.int(256)));
}

export interface Fuzzed {
  bytes: Uint8Array;
  breaks: boolean;
}
