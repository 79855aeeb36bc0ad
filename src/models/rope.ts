import { InvalidArgumentError } from '../errors.ts';
import { bfloat16ToFloat, cat, floatToBfloat16, indexSelect, isTracing, rotaryEmbedding, type Tensor, tensor } from '../tensor/index.ts';

/**
 * Rotary position embeddings as transformers 5.17 computes them (modeling_rope_utils.py): the
 * inverse frequencies with their scalings (linear, dynamic, yarn, llama3), the cos/sin tables
 * for a batch of positions, and their application to the first `rotaryDim` dims of each head
 * (all of them unless the rotary is partial). Every step is rounded to float32 where
 * transformers computes in float32, so the tables equal its tables.
 */

/** The rope scalings built here (rope_scaling's `rope_type`; 'default' is no scaling). */
export const ROPE_TYPES = ['linear', 'dynamic', 'yarn', 'llama3'] as const;
export type RopeScalingType = (typeof ROPE_TYPES)[number];

/** A config's rope_scaling, as read from config.json (absent for the default rotary). */
export interface RopeScaling {
  type: RopeScalingType;
  /** How much longer a context the scaling stretches to. */
  factor: number;
  /** llama3, yarn: the context the model was pre-trained on. */
  originalMaxPositions?: number;
  /** llama3: the wavelength bounds, as fractions of originalMaxPositions (1 and 4 in the checkpoints that use it). */
  lowFreqFactor?: number;
  highFreqFactor?: number;
  /** yarn: the cos/sin multiplier (default from factor, mscale and mscaleAllDim). */
  attentionFactor?: number;
  /** yarn: the ramp's bounds in rotations (32 and 1 by default). */
  betaFast?: number;
  betaSlow?: number;
  mscale?: number;
  mscaleAllDim?: number;
  /** yarn: round the ramp's bounds to whole dims (true by default). */
  truncate?: boolean;
}

/** What a rotary table needs: its base, its dims, and its scaling. */
export interface RopeSpec {
  theta: number;
  /** Dims rotated in each head (head dim × partial rotary factor, even). */
  rotaryDim: number;
  /** The model's positions (dynamic scaling computes its base from them). */
  maxPositions: number;
  scaling?: RopeScaling;
  /**
   * The dtype the inverse-frequency buffer is held in. transformers keeps it in float32 whatever
   * dtype it loads a checkpoint in (absent here); a model cast whole with `.to(torch.bfloat16)`
   * rounds it, buffers included, and then computes its tables from the rounded frequencies.
   */
  invFreqDtype?: 'bfloat16';
}

type Json = Record<string, unknown>;

function optionalNumber(obj: Json, key: string, where: string): number | undefined {
  const v = obj[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new InvalidArgumentError(`config.json ${where}.${key} must be a number, got ${JSON.stringify(v)}`);
  return v;
}

function requiredNumber(obj: Json, key: string, where: string, type: string): number {
  const v = optionalNumber(obj, key, where);
  if (v === undefined) throw new InvalidArgumentError(`config.json ${where} of type '${type}' lacks '${key}'`);
  return v;
}

/**
 * A config.json's rotary: rope_theta and rope_scaling (or the rope_parameters transformers 5
 * writes), as transformers reads them. Returns the base and the scaling (undefined for the
 * default rotary); a scaling type not built here is refused with its name.
 */
export function ropeFromHF(raw: Json, defaultTheta = 10000): { theta: number; scaling?: RopeScaling } {
  const params = (raw.rope_scaling ?? raw.rope_parameters ?? null) as Json | null;
  const where = raw.rope_scaling ? 'rope_scaling' : 'rope_parameters';
  if (params !== null && (typeof params !== 'object' || Array.isArray(params))) {
    throw new InvalidArgumentError(`config.json ${where} must be an object, got ${JSON.stringify(params)}`);
  }
  const topTheta = optionalNumber(raw, 'rope_theta', 'config');
  const theta = (params && optionalNumber(params, 'rope_theta', where)) ?? topTheta ?? defaultTheta;
  if (!(theta > 0)) throw new InvalidArgumentError(`rope_theta must be positive, got ${theta}`);
  const type = params ? String(params.rope_type ?? params.type ?? 'default') : 'default';
  if (type === 'default') return { theta };
  if (!(ROPE_TYPES as readonly string[]).includes(type)) {
    throw new InvalidArgumentError(`rope_scaling type '${type}' is not supported (default, ${ROPE_TYPES.join(', ')})`);
  }
  const p = params as Json;
  const t = type as RopeScalingType;
  const factor = requiredNumber(p, 'factor', where, t);
  if (!(factor > 0)) throw new InvalidArgumentError(`rope_scaling factor must be positive, got ${factor}`);
  const scaling: RopeScaling = { type: t, factor };
  if (t === 'llama3' || t === 'yarn') {
    // transformers: a top-level original_max_position_embeddings overrides rope_scaling's; else max_position_embeddings
    const original = optionalNumber(raw, 'original_max_position_embeddings', 'config')
      ?? optionalNumber(p, 'original_max_position_embeddings', where)
      ?? optionalNumber(raw, 'max_position_embeddings', 'config');
    if (original === undefined || !(original > 0)) throw new InvalidArgumentError(`rope_scaling of type '${t}' needs original_max_position_embeddings`);
    scaling.originalMaxPositions = original;
  }
  if (t === 'llama3') {
    scaling.lowFreqFactor = requiredNumber(p, 'low_freq_factor', where, t);
    scaling.highFreqFactor = requiredNumber(p, 'high_freq_factor', where, t);
  }
  if (t === 'yarn') {
    for (const [key, field] of [['attention_factor', 'attentionFactor'], ['beta_fast', 'betaFast'], ['beta_slow', 'betaSlow'],
      ['mscale', 'mscale'], ['mscale_all_dim', 'mscaleAllDim']] as const) {
      const v = optionalNumber(p, key, where);
      if (v !== undefined) scaling[field] = v;
    }
    if (p.truncate !== undefined) {
      // transformers truncates unless truncate is given and falsy (null included)
      if (typeof p.truncate !== 'boolean' && p.truncate !== null) {
        throw new InvalidArgumentError(`rope_scaling truncate must be a boolean, got ${JSON.stringify(p.truncate)}`);
      }
      scaling.truncate = p.truncate === true;
    }
  }
  return { theta, scaling };
}

/** rope_scaling as config.json writes it (null for the default rotary); ropeFromHF reads it back. */
export function ropeToHF(scaling: RopeScaling | undefined): Json | null {
  if (!scaling) return null;
  const out: Json = { rope_type: scaling.type, factor: scaling.factor };
  const keys: [keyof RopeScaling, string][] = [
    ['originalMaxPositions', 'original_max_position_embeddings'], ['lowFreqFactor', 'low_freq_factor'], ['highFreqFactor', 'high_freq_factor'],
    ['attentionFactor', 'attention_factor'], ['betaFast', 'beta_fast'], ['betaSlow', 'beta_slow'], ['mscale', 'mscale'],
    ['mscaleAllDim', 'mscale_all_dim'], ['truncate', 'truncate'],
  ];
  for (const [field, key] of keys) if (scaling[field] !== undefined) out[key] = scaling[field];
  return out;
}

const f32 = Math.fround;

/** θ^(−2i/d) for i < d/2 in float32, as `1 / base ** (arange(0, d, 2).float() / d)`. */
function defaultInvFreq(base: number, dim: number): Float32Array {
  const inv = new Float32Array(dim / 2);
  for (let i = 0; i < dim / 2; i++) inv[i] = 1 / f32(base ** f32((2 * i) / dim));
  return inv;
}

/**
 * The inverse frequencies of a rotary and the factor its cos/sin are multiplied by (1 but for
 * yarn), as transformers' ROPE_INIT_FUNCTIONS compute them at initialisation.
 */
export function inverseFrequencies(spec: RopeSpec): { invFreq: Float32Array; attentionScaling: number } {
  const { theta, rotaryDim: dim, scaling } = spec;
  if (!scaling) return { invFreq: defaultInvFreq(theta, dim), attentionScaling: 1 };
  const factor = scaling.factor;
  switch (scaling.type) {
    case 'linear': {
      const inv = defaultInvFreq(theta, dim);
      for (let i = 0; i < inv.length; i++) inv[i] = inv[i] / f32(factor);
      return { invFreq: inv, attentionScaling: 1 };
    }
    case 'dynamic': {
      // the base for a sequence of max_position_embeddings: positions past it are refused, so it never grows
      const L = spec.maxPositions;
      const base = theta * ((factor * L) / L - (factor - 1)) ** (dim / (dim - 2));
      return { invFreq: defaultInvFreq(f32(base), dim), attentionScaling: 1 };
    }
    case 'llama3': {
      const inv = defaultInvFreq(theta, dim);
      const old = scaling.originalMaxPositions!;
      const low = scaling.lowFreqFactor!;
      const high = scaling.highFreqFactor!;
      const lowWavelen = f32(old / low);
      const highWavelen = f32(old / high);
      const out = new Float32Array(inv.length);
      for (let i = 0; i < inv.length; i++) {
        const wavelen = f32(f32(2 * Math.PI) / inv[i]);
        const scaled = wavelen > lowWavelen ? f32(inv[i] / f32(factor)) : inv[i];
        const medium = !(wavelen < highWavelen) && !(wavelen > lowWavelen);
        if (medium) {
          const smooth = f32(f32(f32(old / wavelen) - f32(low)) / f32(high - low));
          out[i] = f32(f32(f32(f32(1 - smooth) * scaled) / f32(factor)) + f32(smooth * scaled));
        } else {
          out[i] = scaled;
        }
      }
      return { invFreq: out, attentionScaling: 1 };
    }
    case 'yarn': {
      const original = scaling.originalMaxPositions!;
      const mscaleOf = (scale: number, m = 1) => (scale <= 1 ? 1 : 0.1 * m * Math.log(scale) + 1);
      let attention = scaling.attentionFactor;
      if (attention === undefined) {
        attention = scaling.mscale && scaling.mscaleAllDim
          ? mscaleOf(factor, scaling.mscale) / mscaleOf(factor, scaling.mscaleAllDim)
          : mscaleOf(factor);
      }
      const betaFast = scaling.betaFast || 32;
      const betaSlow = scaling.betaSlow || 1;
      const correctionDim = (rotations: number) => (dim * Math.log(original / (rotations * 2 * Math.PI))) / (2 * Math.log(theta));
      let low = correctionDim(betaFast);
      let high = correctionDim(betaSlow);
      if (scaling.truncate !== false) {
        low = Math.floor(low);
        high = Math.ceil(high);
      }
      low = Math.max(low, 0);
      high = Math.min(high, dim - 1);
      if (low === high) high += 0.001;
      const half = dim / 2;
      const inv = new Float32Array(half);
      for (let i = 0; i < half; i++) {
        const pos = f32(theta ** f32((2 * i) / dim));
        const extrapolation = f32(1 / pos);
        const interpolation = f32(1 / f32(f32(factor) * pos));
        const ramp = Math.min(1, Math.max(0, f32(f32(i - f32(low)) / f32(high - low))));
        const extrapolationFactor = f32(1 - ramp);
        inv[i] = f32(f32(interpolation * f32(1 - extrapolationFactor)) + f32(extrapolation * extrapolationFactor));
      }
      return { invFreq: inv, attentionScaling: attention };
    }
  }
}

/** cos and sin tables [B, T, rotaryDim] for int32 positions [B, T] (halves repeated, as transformers' `cat((freqs, freqs))`). */
export function rotaryTablesFor(positions: Tensor, spec: RopeSpec): { cos: Tensor; sin: Tensor } {
  const [b, t] = positions.shape;
  const dim = spec.rotaryDim;
  const half = dim / 2;
  const { invFreq, attentionScaling } = inverseFrequencies(spec);
  if (spec.invFreqDtype === 'bfloat16') for (let i = 0; i < half; i++) invFreq[i] = bfloat16ToFloat(floatToBfloat16(invFreq[i]));
  const scale = f32(attentionScaling);
  const cos = new Float32Array(b * t * dim);
  const sin = new Float32Array(b * t * dim);
  for (let r = 0; r < b * t; r++) {
    const p = positions.data[r];
    for (let i = 0; i < half; i++) {
      const angle = f32(p * invFreq[i]);
      const c = scale === 1 ? Math.cos(angle) : f32(f32(Math.cos(angle)) * scale);
      const s = scale === 1 ? Math.sin(angle) : f32(f32(Math.sin(angle)) * scale);
      cos[r * dim + i] = c;
      cos[r * dim + i + half] = c;
      sin[r * dim + i] = s;
      sin[r * dim + i + half] = s;
    }
  }
  return { cos: tensor(cos, [b, t, dim]), sin: tensor(sin, [b, t, dim]) };
}

const tableCache = new WeakMap<Tensor, Map<string, { cos: Tensor; sin: Tensor }>>();

/** The largest of a host tensor's values (positions, as traced). */
function maxOf(t: Tensor): number {
  let m = -Infinity;
  for (const v of t.data) m = Math.max(m, v);
  return m;
}

/**
 * While a trace records, rotary tables are rows of a whole table of this many positions at most (2 × 16384 × dim floats;
 * the model's own count where smaller): a step at positions beyond it takes its tables as constants of the trace.
 */
const TRACED_TABLE_POSITIONS = 16384;
/** The whole table of each spec: positions 0 … maxPositions − 1, [maxPositions, rotaryDim]. */
const wholeTables = new Map<string, { cos: Tensor; sin: Tensor }>();

function tracedTables(positions: Tensor, spec: RopeSpec, key: string): { cos: Tensor; sin: Tensor } {
  let whole = wholeTables.get(key);
  if (whole === undefined) {
    const n = Math.min(spec.maxPositions, TRACED_TABLE_POSITIONS);
    const all = rotaryTablesFor(tensor(Int32Array.from({ length: n }, (_, i) => i), [1, n], 'int32'), spec);
    whole = { cos: all.cos.reshape([n, spec.rotaryDim]), sin: all.sin.reshape([n, spec.rotaryDim]) };
    if (wholeTables.size > 16) wholeTables.clear();
    wholeTables.set(key, whole);
  }
  const [b, t] = positions.shape;
  const rows = positions.reshape([b * t]);
  return {
    cos: indexSelect(whole.cos, 0, rows).reshape([b, t, spec.rotaryDim]),
    sin: indexSelect(whole.sin, 0, rows).reshape([b, t, spec.rotaryDim]),
  };
}

/**
 * rotaryTablesFor, computed once per positions tensor and spec (every block of a forward
 * shares them; positions tensors are not mutated).
 */
export function cachedRotaryTables(positions: Tensor, spec: RopeSpec, key = JSON.stringify(spec)): { cos: Tensor; sin: Tensor } {
  // while a trace records, the tables are rows of the whole table picked by the positions (an op): a replay computes the
  // rows of its own positions, the same bits rotaryTablesFor gives them
  // (a dynamic scaling depends on the sequence's length, not only each position: its tables are constants of the trace)
  if (isTracing() && spec.scaling?.type !== 'dynamic' && maxOf(positions) < Math.min(spec.maxPositions, TRACED_TABLE_POSITIONS)) {
    return tracedTables(positions, spec, key);
  }
  let bySpec = tableCache.get(positions);
  if (!bySpec) {
    bySpec = new Map();
    tableCache.set(positions, bySpec);
  }
  let tables = bySpec.get(key);
  if (!tables) {
    tables = rotaryTablesFor(positions, spec);
    bySpec.set(key, tables);
  }
  return tables;
}

/**
 * Rotates the first cos.shape[-1] dims of every head of x [B, H, T, D] (all of them unless the
 * rotary is partial) and passes the rest through, as transformers' apply_rotary_pos_emb.
 */
export function applyRotary(x: Tensor, rope: { cos: Tensor; sin: Tensor }): Tensor {
  const d = x.shape[3];
  const r = rope.cos.shape[2];
  if (r === d) return rotaryEmbedding(x, rope.cos, rope.sin);
  const [rot, pass] = x.split([r, d - r], -1);
  return cat([rotaryEmbedding(rot, rope.cos, rope.sin), pass], -1); // [B, H, T, D]
}
