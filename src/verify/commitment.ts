import type { CausalLM } from '../models/index.ts';
import { cat, noGrad, type Tensor } from '../tensor/index.ts';
import type { ComputeFormat } from './compare.ts';
import { hashTensors } from './hash.ts';
import { type ChunkCheck, checkChunk, closedChunks, COMMIT_BYTES, COMMIT_CHUNK, COMMIT_TOPK, type WorkRecord } from './records/index.ts';
import { auxHash, sessionStepHash, type Verdict } from './reexec.ts';
import { KVCache } from '../models/index.ts';

/** The most a checked chunk may differ from its commitment and pass: sign-or-exponent mismatches of 128, mean and median |Δmantissa|. */
export interface CommitBound {
  exp: number;
  mean: number;
  median: number;
}

/**
 * The bounds a recomputed chunk is held to, by the format the section's matrices are held in (see bench/commit-drift.ts).
 * PROVISIONAL: set before the full calibration.
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

const PROOF_BYTES = COMMIT_BYTES();

/**
 * Checks the sampled chunks of a session's activation commitments by ONE prefill of the section over every input the
 * session was sent (TOPLOC's check): `section` computes with the weights the worker announced (in their format), on
 * the validator's own backend; each record in `checks` (signed by the worker, of this session) carries the commitments
 * of the chunks its step closed, and those in `chunks` are compared with what the prefill gives, row by row, under
 * COMMIT_THRESHOLDS[format]. `sent` (the hashes of the steps as the user sent them) ties the inputs to the session.
 * @example
 * const verdict = checkCommitments(section, { last, checks, chunks: [0, 3], history, sent }, 'f32')
 */
export function checkCommitments(
  section: CausalLM,
  req: { last: WorkRecord; checks: WorkRecord[]; chunks: number[]; history: SessionStep[]; sent?: string[] },
  format: ComputeFormat,
): Verdict & { chunks?: number; worst?: ChunkCheck } {
  const { last, checks, history, sent } = req;
  const fail = (reason: string): Verdict => ({ ok: false, reason });
  if (history.length === 0) return fail('the bundle has no inputs');
  const stepHash = (h: SessionStep) => sessionStepHash(hashTensors([h.input]), auxHash(h.positions, h.keyMask));
  if (sent && (sent.length !== history.length || history.some((h, i) => stepHash(h) !== sent[i]))) {
    return fail('the inputs it kept are not the ones its session was sent');
  }
  // where each step starts in the cache
  const starts: number[] = [];
  let total = 0;
  for (const h of history) {
    starts.push(total);
    total += h.input.shape[1] ?? 1;
  }
  const lastIn = history.at(-1)!;
  if (hashTensors([lastIn.input]) !== last.input || (last.aux !== undefined && auxHash(lastIn.positions, lastIn.keyMask) !== last.aux)) {
    return fail('the inputs it kept are not the ones its record names');
  }
  const { values, width, rows } = prefill(section, history, total);
  const bound = COMMIT_THRESHOLDS[format];
  const wanted = new Set(req.chunks);
  let checked = 0;
  // the largest of each statistic over the chunks that passed: how close honest drift came to the bounds
  const worst: ChunkCheck = { expMismatches: 0, mantMean: 0, mantMedian: 0 };
  for (const record of checks) {
    const i = starts.indexOf(record.step);
    if (i < 0 || record.session !== last.session || record.job !== last.job || record.peer !== last.peer) {
      return fail(`its record at position ${record.step} is not a step of the session it kept`);
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
      for (let b = 0; b < rows; b++) {
        const at = (c * rows + b) * PROOF_BYTES;
        const mine = values.subarray((b * total + j * COMMIT_CHUNK) * width, (b * total + (j + 1) * COMMIT_CHUNK) * width);
        const check = checkChunk(mine, proofs.subarray(at, at + PROOF_BYTES));
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
  return { ok: true, reason: `${checked} chunk(s) within their commitments`, chunks: checked, worst };
}

/**
 * What the section adds to every position of the session, [rows, total, width] flattened: one forward over all the
 * inputs at once when the last step's key mask covers them all (or there is none), else step by step with a KV cache.
 */
function prefill(section: CausalLM, history: SessionStep[], total: number): { values: Float32Array; width: number; rows: number } {
  const lastMask = history.at(-1)!.keyMask;
  const whole = history.every((h) => h.input.dtype === history[0].input.dtype) && (lastMask === null || lastMask.shape[1] === total);
  let x: Tensor;
  let y: Tensor;
  if (whole) {
    x = history.length === 1 ? history[0].input : cat(history.map((h) => h.input), 1);
    const positions = history.length === 1 ? history[0].positions : cat(history.map((h) => h.positions), 1);
    y = noGrad(() => section.forward(x, { cache: new KVCache(section.config.layers), positions, keyMask: lastMask }));
  } else {
    const cache = new KVCache(section.config.layers);
    const outs = history.map((h) => noGrad(() => section.forward(h.input, { cache, positions: h.positions, keyMask: h.keyMask })));
    x = cat(history.map((h) => h.input), 1);
    y = cat(outs, 1);
  }
  const [rows, , width] = y.shape;
  const out = y.data as Float32Array;
  if (x.dtype !== 'float32' || x.size !== y.size) return { values: out, width, rows };
  const xin = x.data as Float32Array;
  const values = new Float32Array(out.length);
  for (let i = 0; i < out.length; i++) values[i] = out[i] - xin[i];
  return { values, width, rows };
}
