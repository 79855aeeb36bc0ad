import { cat, rotaryEmbedding, type Tensor, tensor } from '../tensor/index.ts';

/**
 * Rotary embeddings on the first `dims` of every head, the rest passed through (GPT-NeoX's
 * `rotary_pct`; all of it for Falcon), with the tables of a forward's positions computed once
 * and shared by its blocks.
 */

export interface RotaryTables {
  cos: Tensor;
  sin: Tensor;
}

const tableCache = new WeakMap<Tensor, Map<string, RotaryTables>>();

/** cos and sin [B, T, dims] for int32 positions [B, T] (float32, as transformers' default rope), once per positions tensor. */
export function rotaryTablesFor(positions: Tensor, dims: number, theta: number): RotaryTables {
  let byKey = tableCache.get(positions);
  if (!byKey) {
    byKey = new Map();
    tableCache.set(positions, byKey);
  }
  const key = `${dims}:${theta}`;
  let tables = byKey.get(key);
  if (!tables) {
    tables = rotaryTables(positions, dims, theta);
    byKey.set(key, tables);
  }
  return tables;
}

/** x [B, H, T, D] with its first `cos.shape[2]` dims rotated (rotate-half), the others unchanged. */
export function partialRotary(x: Tensor, rope: RotaryTables): Tensor {
  const dims = rope.cos.shape[2];
  const d = x.shape[3];
  if (dims === 0) return x;
  if (dims === d) return rotaryEmbedding(x, rope.cos, rope.sin);
  const rotated = rotaryEmbedding(x.narrow(3, 0, dims), rope.cos, rope.sin); // [B, H, T, dims]
  return cat([rotated, x.narrow(3, dims, d - dims)], 3); // [B, H, T, D]
}

/**
 * transformers' default rope in float32: inverse frequencies 1 / θ^(2i/d), angles position ×
 * frequency, each half of the dims the same angles.
 */
function rotaryTables(positions: Tensor, dims: number, theta: number): RotaryTables {
  const [b, t] = positions.shape;
  const half = dims / 2;
  const invFreq = new Float32Array(half);
  for (let i = 0; i < half; i++) invFreq[i] = 1 / Math.fround(theta ** Math.fround((2 * i) / dims));
  const cos = new Float32Array(b * t * dims);
  const sin = new Float32Array(b * t * dims);
  for (let r = 0; r < b * t; r++) {
    const p = positions.data[r];
    for (let i = 0; i < half; i++) {
      const angle = Math.fround(p * invFreq[i]);
      const c = Math.cos(angle);
      const s = Math.sin(angle);
      cos[r * dims + i] = c;
      cos[r * dims + i + half] = c;
      sin[r * dims + i] = s;
      sin[r * dims + i + half] = s;
    }
  }
  return { cos: tensor(cos, [b, t, dims]), sin: tensor(sin, [b, t, dims]) };
}
