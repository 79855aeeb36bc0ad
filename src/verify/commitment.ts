import { type CausalLM, KVCache } from '../models/index.ts';
import { cat, noGrad, type Tensor } from '../tensor/index.ts';
import type { ComputeFormat } from './compare.ts';
import { hashTensors } from './hash.ts';
import { type ChunkCheck, checkChunk, closedChunks, COMMIT_BYTES, COMMIT_CHUNK, COMMIT_TOPK, type WorkRecord } from './records/index.ts';
import { auxHash, sessionStepHash, type Verdict } from './reexec.ts';

/** The most a checked chunk may differ from its commitment and pass: sign-or-exponent mismatches of 128, mean and median |Δ|. */
export interface CommitBound {
  exp: number;
  /** Mean and median |Δ| in units of bfloat16's last place, over the values whose sign and exponent agree. */
  mean: number;
  median: number;
}

/**
 * The bounds a recomputed chunk is held to, by the format the section's matrices are held in. From bench/commit-drift.ts
 * (--seeds 2: 2,576 honest chunks, none over; the README, "Activation commitments", has the table): each bound lies
 * between the worst honest difference across js, ort (1 and 2 threads, compiled graphs, decoding against a prefill)
 * and webgpu, against js and ort validators, and the closest cheat to catch.
 * - f32 and bf16 (computed in float32): honest at most 0 mismatches, mean 0.0079 (one value at the top-k boundary),
 *   median 1.2e-4; noise of 1e-3 at least median 0.027, int8 for f32 0.28: the median bound 0.0015 is 12× above the
 *   one and 18× below the other, the mean bound 0.016 2× above the honest outlier.
 * - int8 and int4 (MatMulNBits quantizes activations: other backends round differently): honest at most 19
 *   mismatches, mean 2.07, median 1.88; int4 for int8 at least 14, 5.14, 3.87 (the mean bound: 1.55× and 1.6×, thin);
 *   another model, zeros, the input returned, a replay ≥ 117 mismatches. Noise below about 1e-2 passes, as
 *   ORT_TOLERANCES lets it.
 */
export const COMMIT_THRESHOLDS: Readonly<Record<ComputeFormat, CommitBound>> = {
  f32: { exp: 4, mean: 0.016, median: 0.0015 },
  bf16: { exp: 4, mean: 0.016, median: 0.0015 },
  int8: { exp: 40, mean: 3.2, median: 2.4 },
  int4: { exp: 40, mean: 3.2, median: 2.4 },
};

/** Whether a chunk's check is within the bound. */
export function withinBound(c: ChunkCheck, bound: CommitBound): boolean {
  return c.expMismatches <= bound.exp && c.mantMean <= bound.mean && c.mantMedian <= bound.median;
}

/** A decoding session's steps as the worker kept them, in order (what the validator recomputes). */
export interface SessionStep {
  input: Tensor;
  positions: Tensor;
  keyMask: Tensor | null;
}

/**
 * What a validator holds of a session it checks as it goes: the section's KV cache over the steps it prefilled, the
 * hashes of those steps, and what the section added at the positions of the chunk still open (its values are needed
 * when that chunk closes). A later check prefills only the steps after.
 */
export interface SessionPrefill {
  cache: KVCache;
  /** Steps prefilled, and the positions they hold. */
  steps: number;
  position: number;
  /** The hashes of those steps as the user sent them. */
  sent: string[];
  /** Output − input at positions [32·⌊position/32⌋, position), [rows, n, width] (null before any step). */
  open: Float32Array | null;
  rows: number;
  width: number;
  /** About what it holds: its KV cache and the open chunk's values. */
  bytes: number;
}

const PROOF_BYTES = COMMIT_BYTES();

/**
 * Checks the sampled chunks of a session's activation commitments by ONE prefill of the section over the inputs the
 * session was sent (TOPLOC's check): `section` computes with the weights the worker announced (in their format), on
 * the validator's own backend; each record in `checks` (signed by the worker, of this session) carries the commitments
 * of the chunks its step closed, and those in `chunks` are compared with what the prefill gives, row by row, under
 * COMMIT_THRESHOLDS[format]. `sent` (the hashes of every step as the user sent them) ties the inputs to the session.
 * With `prior` (a check of the same session made before), `history` holds only the steps after it: only those are
 * prefilled, and `prior` is brought up to the session's last step.
 * @example
 * const verdict = checkCommitments(section, { last, checks, chunks: [0, 3], history, sent }, 'f32')
 */
export function checkCommitments(
  section: CausalLM,
  req: { last: WorkRecord; checks: WorkRecord[]; chunks: number[]; history: SessionStep[]; sent?: string[] },
  format: ComputeFormat,
  prior?: SessionPrefill,
): Verdict & { chunks?: number; worst?: ChunkCheck; prefill?: SessionPrefill } {
  const { last, checks, history, sent } = req;
  const fail = (reason: string): Verdict => ({ ok: false, reason });
  if (history.length === 0) return fail('the bundle has no inputs');
  const before = prior?.steps ?? 0;
  const stepHash = (h: SessionStep) => sessionStepHash(hashTensors([h.input]), auxHash(h.positions, h.keyMask));
  if (sent && (sent.length !== before + history.length || history.some((h, i) => stepHash(h) !== sent[before + i]))) {
    return fail('the inputs it kept are not the ones its session was sent');
  }
  if (prior && sent && prior.sent.some((h, i) => sent[i] !== h)) return fail('its session was sent other steps than the ones checked before');
  // where each new step starts in the cache
  const starts: number[] = [];
  let end = prior?.position ?? 0;
  for (const h of history) {
    starts.push(end);
    end += h.input.shape[1] ?? 1;
  }
  const lastIn = history.at(-1)!;
  if (hashTensors([lastIn.input]) !== last.input || (last.aux !== undefined && auxHash(lastIn.positions, lastIn.keyMask) !== last.aux)) {
    return fail('the inputs it kept are not the ones its record names');
  }
  const state = prefill(section, history, end, prior);
  // the values from the open chunk's first position on: [rows, end − base, width]
  const { values, base, rows, width } = state;
  const span = end - base;
  const bound = COMMIT_THRESHOLDS[format];
  const wanted = new Set(req.chunks);
  let checked = 0;
  // the largest of each statistic over the chunks that passed: how close honest drift came to the bounds
  const worst: ChunkCheck = { expMismatches: 0, mantMean: 0, mantMedian: 0 };
  for (const record of checks) {
    const i = starts.indexOf(record.step);
    if (i < 0 || record.session !== last.session || record.job !== last.job || record.peer !== last.peer) {
      return fail(`its record at position ${record.step} is not a step of the session checked now`);
    }
    const h = history[i];
    if (sessionStepHash(record.input, record.aux ?? '') !== stepHash(h)) return fail(`its record at position ${record.step} names other inputs than it kept`);
    const closed = closedChunks(record.step, h.input.shape[1] ?? 1);
    const proofs = record.commits === undefined ? new Uint8Array(0) : new Uint8Array(Buffer.from(record.commits, 'base64'));
    if (proofs.length !== closed.length * rows * PROOF_BYTES) {
      return fail(`its record at position ${record.step} commits ${proofs.length} bytes, not ${closed.length} chunk(s) of ${rows} row(s)`);
    }
    for (const [c, j] of closed.entries()) {
      if (!wanted.has(j)) continue;
      if (j * COMMIT_CHUNK < base) return fail(`chunk ${j} was checked before`);
      for (let b = 0; b < rows; b++) {
        const at = (c * rows + b) * PROOF_BYTES;
        const from = (b * span + j * COMMIT_CHUNK - base) * width;
        const check = checkChunk(values.subarray(from, from + COMMIT_CHUNK * width), proofs.subarray(at, at + PROOF_BYTES));
        checked++;
        worst.expMismatches = Math.max(worst.expMismatches, check.expMismatches);
        worst.mantMean = Math.max(worst.mantMean, check.mantMean);
        worst.mantMedian = Math.max(worst.mantMedian, check.mantMedian);
        if (!withinBound(check, bound)) {
          return fail(
            `chunk ${j} (positions ${j * COMMIT_CHUNK}-${(j + 1) * COMMIT_CHUNK - 1}), row ${b}: ${check.expMismatches} of ${COMMIT_TOPK} values `
            + `differ in sign or exponent; |Δ| in bfloat16 units: mean ${check.mantMean.toPrecision(3)}, median ${check.mantMedian.toPrecision(3)} `
            + `(${format} bounds ${bound.exp}, ${bound.mean}, ${bound.median})`,
          );
        }
      }
    }
  }
  if (checked === 0) return fail('none of the chunks asked for is committed in the records given');
  // what a later check of the session goes on from: the cache, and the open chunk's values
  const openFrom = COMMIT_CHUNK * Math.floor(end / COMMIT_CHUNK);
  const open = new Float32Array(rows * (end - openFrom) * width);
  for (let b = 0; b < rows; b++) {
    open.set(values.subarray((b * span + openFrom - base) * width, (b * span + span) * width), b * (end - openFrom) * width);
  }
  const kvPerToken = section.layers.reduce((sum, l) => sum + l.profile().kvBytesPerToken, 0);
  const next: SessionPrefill = {
    cache: state.cache, steps: before + history.length, position: end, sent: [...(sent ?? [])], open, rows, width,
    bytes: rows * end * kvPerToken + open.byteLength,
  };
  return { ok: true, reason: `${checked} chunk(s) within their commitments`, chunks: checked, worst, prefill: next };
}

/**
 * What the section adds to the new positions, prepended with the open chunk's values `prior` kept: [rows, end − base,
 * width] with base the open chunk's first position. One forward over all the new inputs at once when the last step's
 * key mask covers them all (or there is none), else step by step; always on the prior's KV cache, or a fresh one.
 */
function prefill(section: CausalLM, history: SessionStep[], end: number, prior?: SessionPrefill) {
  const cache = prior?.cache ?? new KVCache(section.config.layers);
  const lastMask = history.at(-1)!.keyMask;
  const whole = history.every((h) => h.input.dtype === history[0].input.dtype) && (lastMask === null || lastMask.shape[1] === end);
  const x = history.length === 1 ? history[0].input : cat(history.map((h) => h.input), 1);
  let y: Tensor;
  if (whole) {
    const positions = history.length === 1 ? history[0].positions : cat(history.map((h) => h.positions), 1);
    y = noGrad(() => section.forward(x, { cache, positions, keyMask: lastMask }));
  } else {
    y = cat(history.map((h) => noGrad(() => section.forward(h.input, { cache, positions: h.positions, keyMask: h.keyMask }))), 1);
  }
  const [rows, steps, width] = y.shape;
  const out = y.data as Float32Array;
  const added = x.dtype === 'float32' && x.size === y.size ? x.data as Float32Array : null;
  const start = prior?.position ?? 0;
  const base = COMMIT_CHUNK * Math.floor(start / COMMIT_CHUNK);
  const kept = start - base;
  const span = kept + steps;
  const values = new Float32Array(rows * span * width);
  for (let b = 0; b < rows; b++) {
    if (kept > 0 && prior?.open) values.set(prior.open.subarray(b * kept * width, (b + 1) * kept * width), b * span * width);
    for (let i = 0; i < steps * width; i++) {
      const at = b * steps * width + i;
      values[(b * span + kept) * width + i] = added ? out[at] - added[at] : out[at];
    }
  }
  return { values, base, rows, width, cache };
}
