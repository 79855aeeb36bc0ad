import { createHash } from 'node:crypto';
import { InvalidMessageError } from '../errors.ts';
import { createModel, type ModelConfig, runLayers } from '../models/index.ts';
import { type DType, noGrad, type Tensor, trace, type TracedStep, withBackend, zeros } from '../tensor/index.ts';
import { agree } from './compare.ts';
import { hashTensors } from './hash.ts';
import type { WorkRecord } from './records/index.ts';

/**
 * Disputes by bisection (after Verde, Gensyn's refereed delegation, arXiv 2502.19405): when two
 * workers' results of the same computation disagree, each commits to every value of the traced
 * step it computed (a Merkle root over one leaf per slot of the trace: the step's input, its
 * constants, and each op's results), and a referee bisects the ops to the first one whose inputs
 * agree and whose outputs differ, then re-runs that op alone. This file is the pure part: the
 * leaves, the tree and its proofs, the shape of a trace, the search, the referee's own trace, and
 * what a side answers (DisputeSide); validator/dispute.ts runs a dispute over the network.
 */

/** The sha256 of a string, hex. */
function sha(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/** The leaf of slot `slot` whose value hashes (hashTensors) as `value`. */
export function leafOf(slot: number, value: string): string {
  return sha(`slot ${slot}:${value}`);
}

function parent(left: string, right: string): string {
  return sha(`node:${left}${right}`);
}

/** The levels of the Merkle tree over `leaves`, bottom first (an odd node goes up as it is). */
function levels(leaves: readonly string[]): string[][] {
  if (leaves.length === 0) throw new InvalidMessageError('a Merkle tree needs at least one leaf');
  const out = [[...leaves]];
  while (out.at(-1)!.length > 1) {
    const below = out.at(-1)!;
    const up: string[] = [];
    for (let i = 0; i < below.length; i += 2) up.push(i + 1 < below.length ? parent(below[i], below[i + 1]) : below[i]);
    out.push(up);
  }
  return out;
}

/** A Merkle tree over a step's leaves: its root, and the proof of any leaf. */
export class MerkleTree {
  private readonly tree: string[][];

  constructor(leaves: readonly string[]) {
    this.tree = levels(leaves);
  }

  get root(): string {
    return this.tree.at(-1)![0];
  }

  get size(): number {
    return this.tree[0].length;
  }

  /** The siblings from leaf `i` up to the root ('' where a node had none and went up as it was). */
  proof(i: number): string[] {
    if (!Number.isSafeInteger(i) || i < 0 || i >= this.size) throw new InvalidMessageError(`no leaf ${i} in a tree of ${this.size}`);
    const out: string[] = [];
    let at = i;
    for (const level of this.tree.slice(0, -1)) {
      const sibling = at ^ 1;
      out.push(sibling < level.length ? level[sibling] : '');
      at >>= 1;
    }
    return out;
  }
}

/** Whether `leaf` is leaf `i` of the tree of `size` leaves whose root is `root`, by `proof`. */
export function verifyProof(root: string, size: number, i: number, leaf: string, proof: readonly string[]): boolean {
  if (!Number.isSafeInteger(i) || i < 0 || i >= size) return false;
  let width = size;
  let at = i;
  let node = leaf;
  let depth = 0;
  while (width > 1) {
    const sibling = proof[depth++];
    if (sibling === undefined) return false;
    const hasSibling = (at ^ 1) < width;
    if (hasSibling !== (sibling !== '')) return false;
    if (hasSibling) node = at % 2 === 0 ? parent(node, sibling) : parent(sibling, node);
    at >>= 1;
    width = Math.ceil(width / 2);
  }
  return depth === proof.length && node === root;
}

/** What a dispute needs of a traced step: its slots' kinds, shapes and dtypes, and its ops' names and slots. */
export interface StepShape {
  readonly slots: readonly { readonly kind: 'input' | 'constant' | 'result'; readonly shape: readonly number[]; readonly dtype: string }[];
  readonly ops: readonly { readonly op: string; readonly inputSlots: readonly number[]; readonly outputSlots: readonly number[] }[];
}

/**
 * The sha256 of a step's shape: every slot's kind, dtype and shape, and every op's name and slots, in
 * order. Both sides and the referee's own trace of the section must give the same: a side whose
 * step is another loses.
 */
export function traceHash(step: StepShape): string {
  const slots = step.slots.map((s) => `${s.kind} ${s.dtype}[${s.shape.join(',')}]`).join(';');
  const ops = step.ops.map((o) => `${o.op}(${o.inputSlots.join(',')})->(${o.outputSlots.join(',')})`).join(';');
  return sha(`slots ${slots}|ops ${ops}`);
}

/** Per slot, the op that wrote it (-1 for the step's inputs and constants). */
export function producers(step: StepShape): number[] {
  const out = step.slots.map(() => -1);
  step.ops.forEach((o, i) => {
    for (const s of o.outputSlots) out[s] = i;
  });
  return out;
}

/** Where a bisection ended: an op whose inputs agree and whose outputs differ, or an input or constant the sides differ on. */
export type Disagreement = { kind: 'op'; op: number } | { kind: 'slot'; slot: number };

/** What a bisection asked: how many slots it compared (each a leaf of each side, or its values). */
export interface BisectionCost {
  compared: number;
}

/**
 * Finds an op whose input slots agree on both sides and whose outputs do not, starting from op
 * `last`, whose outputs are known to differ: binary search over the ops before it (op lo agrees,
 * op hi differs), then a check of op hi's inputs; an input written by an op j that differs makes
 * j the new hi (the search goes on below it). `differs(slot)` compares one slot on both sides
 * (bitwise on js; within tolerance across backends); each slot is asked once.
 * @example
 * const found = await bisect(shape, shape.ops.length - 1, async (s) => a[s] !== b[s])
 */
export async function bisect(
  step: StepShape,
  last: number,
  differs: (slot: number) => Promise<boolean>,
  cost: BisectionCost = { compared: 0 },
): Promise<Disagreement> {
  const known = new Map<number, boolean>();
  const slotDiffers = async (slot: number): Promise<boolean> => {
    let d = known.get(slot);
    if (d === undefined) {
      cost.compared++;
      d = await differs(slot);
      known.set(slot, d);
    }
    return d;
  };
  const opDiffers = async (i: number): Promise<boolean> => {
    for (const s of step.ops[i].outputSlots) if (await slotDiffers(s)) return true;
    return false;
  };
  const from = producers(step);
  let hi = last;
  let lo = -1;
  for (;;) {
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (await opDiffers(mid)) hi = mid;
      else lo = mid;
    }
    let next = -1;
    for (const s of step.ops[hi].inputSlots) {
      if (!(await slotDiffers(s))) continue;
      if (from[s] < 0) return { kind: 'slot', slot: s };
      next = from[s];
      break;
    }
    if (next < 0) return { kind: 'op', op: hi };
    // an earlier op's result differs: the search goes on below it (op lo, after it, no longer bounds it)
    hi = next;
    lo = -1;
  }
}

/** Which side lost a dispute, and why (for the validator's log and the reputation it moves). */
export interface DisputeOutcome {
  /** The sides that lost: 'a', 'b', both, or none (inconclusive: no evidence either way). */
  losers: ('a' | 'b')[];
  reason: string;
  /** The op the dispute ended at, by index and name (absent when it ended before any op). */
  op?: { index: number; name: string };
  inconclusive?: boolean;
}

/**
 * The verdict on op i from the referee's re-run: `matches.a` whether side a's committed outputs are
 * what the op gives from (its own) inputs, and the same for b. A side that does not match loses;
 * both matching is inconclusive (the sides only differed within what the comparison allows).
 */
export function judgeOp(op: { index: number; name: string }, matches: { a: boolean; b: boolean }): DisputeOutcome {
  const losers = (['a', 'b'] as const).filter((s) => !matches[s]);
  const at = `op ${op.index} '${op.name}'`;
  if (losers.length === 0) return { losers: [], op, inconclusive: true, reason: `${at}: both sides' outputs are what the op gives` };
  const who = losers.length === 2 ? 'neither side\'s' : `side ${losers[0]}'s`;
  return { losers: [...losers], op, reason: `${at}: ${who} output is not what the op gives from its inputs` };
}

/** What a side commits to when a dispute opens (the worker's `dispute-commit`). */
export interface Commit {
  record: unknown;
  root: string;
  size: number;
  trace: string;
  /** The slot of the section's output. */
  output: number;
  input: { shape: number[]; dtype: DType };
}

/** One leaf as a side sends it: the slot's value hash and its Merkle proof. */
export interface Leaf {
  slot: number;
  value: string;
  proof: string[];
}

/** One side of a dispute as the referee talks to it (over the stage protocol, or in a test, in memory). */
export interface DisputeSide {
  readonly peer: string;
  readonly record: WorkRecord;
  /** Bytes it sent the referee so far. */
  readonly bytes: number;
  open(): Promise<Commit>;
  leaves(slots: number[]): Promise<Leaf[]>;
  value(slot: number): Promise<Tensor>;
  close(): Promise<void>;
}

/** What a dispute cost: ops in the step and ops re-run, slots compared, leaves and values fetched, bytes received. */
export interface DisputeCost {
  ops: number;
  opsRerun: number;
  compared: number;
  leaves: number;
  values: number;
  bytes: number;
}

export interface DisputeVerdict extends DisputeOutcome {
  /** 'exact' where both records are js (leaves compared bitwise), 'tolerance' otherwise. */
  mode: 'exact' | 'tolerance';
  cost: DisputeCost;
}

const traces = new Map<string, TracedStep<Tensor>>();

/** The referee's own trace of the section on js at the input's shape (a forward on zeros; cached per shape). */
export function refereeTrace(config: ModelConfig, range: [number, number], input: Commit['input']): TracedStep<Tensor> {
  const key = `${JSON.stringify(config)}|${range}|${input.dtype}[${input.shape}]`;
  let step = traces.get(key);
  if (step) return step;
  const [b, t] = input.shape;
  const wanted = input.dtype === 'int32' ? 2 : 3;
  const fits = input.shape.length === wanted && b >= 1 && b <= 256 && t >= 1 && t <= config.maxPositions;
  if (!fits || (wanted === 3 && input.shape[2] !== config.hidden)) {
    throw new InvalidMessageError(`a section of [${range}) does not take a ${input.dtype} input of shape [${input.shape}]`);
  }
  const model = createModel(config, { section: range });
  step = withBackend('js', () => noGrad(() => trace((x: Tensor) => runLayers(model.layers, x, {}, config.maxPositions), [zeros(input.shape, input.dtype)]).step));
  if (traces.size >= 16) traces.delete(traces.keys().next().value!);
  traces.set(key, step);
  return step;
}

/** Whether two values agree: bitwise for integers, within ort's tolerance for floats. */
export function close(x: Tensor, y: Tensor): boolean {
  if (x.dtype !== 'float32' || y.dtype !== 'float32') return hashTensors([x]) === hashTensors([y]);
  return agree('ort', x.data as Float32Array, y.data as Float32Array);
}
