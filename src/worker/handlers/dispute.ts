import { InvalidMessageError } from '../../errors.ts';
import { createModel, type ModelLayer, runLayers } from '../../models/index.ts';
import { int, list } from '../../p2p/index.ts';
import { noGrad, type Tensor, trace } from '../../tensor/index.ts';
import { MerkleTree, leafOf, traceHash } from '../../verify/dispute.ts';
import { hashTensors } from '../../verify/index.ts';
import type { JobEntry } from '../jobs.ts';
import { control, sectionOf, type StageHandler, trainingOf } from './types.ts';

/** Disputes a worker holds the values of at once, per job (each a forward's every intermediate value). */
export const MAX_HELD_DISPUTES = 2;
/** How long a dispute's values are held after it opens: past it, the referee's next request opens it again. */
export const DISPUTE_HOLD_MS = 120_000;
/** Leaves one `dispute-leaves` request may ask for. */
export const MAX_LEAVES_PER_REQUEST = 64;

/** One disputed record's values: every slot of its traced forward, their hashes, and the tree over them. */
interface Held extends ForwardCommitment {
  record: unknown;
  timer: NodeJS.Timeout;
}

const held = new WeakMap<JobEntry, Map<string, Held>>();

/** Which record a dispute request is about (only forwards are disputed today). */
function parseWhich(body: Record<string, unknown>): { step: number; micro: number; key: string } {
  if (body.kind !== 'forward') throw new InvalidMessageError(`dispute: only forward records are disputed, not '${String(body.kind)}'`);
  const step = int(body.step, 'dispute.step');
  const micro = int(body.micro, 'dispute.micro', 0, 1_000_000);
  return { step, micro, key: `${step}:${micro}` };
}

/** Every value of one run of a section's forward, their hashes and the tree over them: what a side commits to. */
export interface ForwardCommitment {
  values: Tensor[];
  hashes: string[];
  tree: MerkleTree;
  trace: string;
  /** The slot of the section's output. */
  output: number;
}

/**
 * Traces the section's forward on `input` and runs it again op by op on the current backend: every
 * slot's value (the input, copies of the constants, each op's results) and hash. `returned`, where
 * given, is the output the worker returned (off js): the output slot's value, what it signed.
 * `onOp` sees each op's outputs as they are made (a test's cheat alters them in place).
 */
export function commitForward(
  layers: readonly ModelLayer[],
  maxPositions: number,
  input: Tensor,
  returned?: Tensor,
  onOp?: (i: number, outputs: readonly Tensor[]) => void,
): ForwardCommitment {
  const values: Tensor[] = [];
  const hashes: string[] = [];
  const shape = noGrad(() => {
    const { step } = trace((x: Tensor) => runLayers(layers, x, {}, maxPositions), [input]);
    // constants are copied: the live weights change at the next step, while the dispute may still ask for them
    step.slots.forEach((s, i) => {
      const t = i === 0 ? input : s.tensor;
      if (t) values[i] = t.packed ? t : t.detach().clone();
    });
    step.replay([input], (i, op, outs) => {
      onOp?.(i, outs);
      op.outputSlots.forEach((s, k) => (values[s] = outs[k]));
    });
    if (returned) values[step.outputSlots[0]] = returned;
    step.slots.forEach((_, i) => (hashes[i] = hashTensors([values[i]])));
    return { output: step.outputSlots[0], trace: traceHash(step) };
  });
  return { values, hashes, tree: new MerkleTree(hashes.map((h, i) => leafOf(i, h))), ...shape };
}

/**
 * Runs the kept forward again, op by op, on this worker's backend, with the weights it computed
 * with (the current ones, or those its last step started from). Off js the output slot holds the
 * output it returned (kept with its record): what it signed.
 */
function recompute(job: JobEntry, step: number, micro: number): Omit<Held, 'timer'> {
  const section = sectionOf(job);
  const { records, executor } = trainingOf(job);
  const kept = records.find('forward', step, micro);
  if (!kept.input) throw new InvalidMessageError(`the input of forward ${step}:${micro} is not kept (verification is off for this job)`);
  let layers = executor.layers;
  if (step !== records.step) {
    // the weights the step started from, in a copy of the section (the live one has stepped since)
    const copy = createModel(section.model.config, { section: section.range });
    copy.loadStateDict(new Map([...records.weightsAt(step), ...records.frozen]));
    layers = copy.layers;
  }
  return { record: kept.record, ...commitForward(layers, section.model.config.maxPositions, kept.input, kept.output) };
}

/** The held values of a dispute, opened (recomputed) if they are not held. */
function open(job: JobEntry, step: number, micro: number, key: string): Held {
  let mine = held.get(job);
  if (!mine) held.set(job, (mine = new Map()));
  const there = mine.get(key);
  if (there) return there;
  if (mine.size >= MAX_HELD_DISPUTES) throw new InvalidMessageError(`this worker holds ${MAX_HELD_DISPUTES} disputes of job ${job.jobId} already`);
  const map = mine;
  // a browser tab's timers have no unref
  const timer = setTimeout(() => map.delete(key), DISPUTE_HOLD_MS);
  timer.unref?.();
  const h = { ...recompute(job, step, micro), timer };
  mine.set(key, h);
  return h;
}

function slotOf(v: unknown, h: Held, what: string): number {
  return int(v, what, 0, h.hashes.length - 1);
}

/**
 * A dispute over a forward record, asked by the job's verifiers (a validator): the worker commits
 * to every value of the section's traced forward for that record (recomputed from the input it
 * kept, op by op), then answers for single values: a leaf with its Merkle proof, or the value itself.
 * - `dispute-open {kind, step, micro}` → `dispute-commit {record, root, size, trace, output, input}`;
 * - `dispute-leaves {…, slots}` (≤ MAX_LEAVES_PER_REQUEST) → `dispute-leaves {leaves: [{slot, value, proof}]}`;
 * - `dispute-value {…, slot}` → the slot's tensor;
 * - `dispute-close {…}` → lets the values go.
 */
export const disputeHandlers: Record<string, StageHandler> = {
  'dispute-open': {
    verifiers: true,
    run: ({ body, job }) => {
      const { step, micro, key } = parseWhich(body);
      const h = open(job, step, micro, key);
      const x = h.values[0];
      const input = { shape: [...x.shape], dtype: x.dtype };
      return control('dispute-commit', { record: h.record, root: h.tree.root, size: h.tree.size, trace: h.trace, output: h.output, input });
    },
  },
  'dispute-leaves': {
    verifiers: true,
    run: ({ body, job }) => {
      const { step, micro, key } = parseWhich(body);
      const h = open(job, step, micro, key);
      const slots = list(body.slots, 'dispute.slots', MAX_LEAVES_PER_REQUEST, (v, what) => slotOf(v, h, what));
      return control('dispute-leaves', { leaves: slots.map((s) => ({ slot: s, value: h.hashes[s], proof: h.tree.proof(s) })) });
    },
  },
  'dispute-value': {
    verifiers: true,
    run: ({ body, job }) => {
      const { step, micro, key } = parseWhich(body);
      const h = open(job, step, micro, key);
      return { kind: 'tensor', tensor: h.values[slotOf(body.slot, h, 'dispute.slot')].detach().clone() };
    },
  },
  'dispute-close': {
    verifiers: true,
    run: ({ body, job }) => {
      const { key } = parseWhich(body);
      const h = held.get(job)?.get(key);
      if (h) {
        clearTimeout(h.timer);
        held.get(job)!.delete(key);
      }
      return control('dispute-closed');
    },
  },
};
