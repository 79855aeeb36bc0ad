import { createHash } from 'node:crypto';
import type { Libp2p, PeerId } from '@libp2p/interface';
import { InvalidArgumentError, InvalidMessageError } from '../errors.ts';
import { configFromHF, type ModelConfig } from '../models/index.ts';
import { fromWire, jobConfigHash, type Logger, obj, parseJobId, parsePeerTarget, type PeerTarget, publicKeyOf } from '../p2p/index.ts';
import { noGrad, type Tensor, withBackend } from '../tensor/index.ts';
import {
  bisect, close, type Commit, type DisputeCost, type DisputeOutcome, type DisputeSide, type DisputeVerdict, judgeOp, type Leaf, leafOf,
  producers, refereeTrace, traceHash, verifyProof,
} from '../verify/dispute.ts';
import { hashTensors, parseRecord, recordId, type Reputation, signatureValid, type WorkRecord } from '../verify/index.ts';
import { CheckQueue } from './check-queue.ts';
import type { EventLog } from './overview.ts';
import type { Settler } from './settlement.ts';
import { openStageStream } from './stage-stream.ts';

/** How long a side of a dispute has for each answer: one that does not answer in time loses. */
export const DISPUTE_TIMEOUT_MS = 30_000;

type Name = 'a' | 'b';
class SideFailed extends Error {
  constructor(readonly sides: Name[], message: string) {
    super(message);
  }
}

/** Both sides' answers at once; a side that fails (or times out) makes the dispute end with it losing. */
async function both<T>(what: string, fa: () => Promise<T>, fb: () => Promise<T>): Promise<[T, T]> {
  const [ra, rb] = await Promise.allSettled([fa(), fb()]);
  const failed = ([['a', ra], ['b', rb]] as const).filter(([, r]) => r.status === 'rejected');
  if (failed.length > 0) {
    const why = failed.map(([n, r]) => `side ${n}: ${((r as PromiseRejectedResult).reason as Error).message}`).join('; ');
    throw new SideFailed(failed.map(([n]) => n), `did not ${what}: ${why}`);
  }
  return [(ra as PromiseFulfilledResult<T>).value, (rb as PromiseFulfilledResult<T>).value];
}

/**
 * Settles a dispute between two workers' records of the same forward (same job, section, input and
 * weights; different outputs): each commits to its step's values, the referee checks both traces
 * against its own, takes each side's signed output as its output slot's value, bisects to an op
 * whose inputs agree and whose outputs differ, and re-runs that op alone on js: from the agreed
 * inputs (both js: bitwise), or from each side's own inputs (a side off js: within tolerance).
 */
export async function settle(config: ModelConfig, sides: Record<Name, DisputeSide>, cost: DisputeCost): Promise<DisputeOutcome & { mode: DisputeVerdict['mode'] }> {
  const { a, b } = sides;
  const mode = a.record.backend === 'js' && b.record.backend === 'js' ? 'exact' : 'tolerance';
  const commits = await both('commit to their values', () => a.open(), () => b.open());
  const c: Record<Name, Commit> = { a: commits[0], b: commits[1] };
  const names: Name[] = ['a', 'b'];
  // a side whose kept record is another, or whose step is not the section's, loses at once
  // (a record that does not parse, or an input the section does not take, is '' and matches nothing)
  const or = (f: () => string): string => {
    try {
      return f();
    } catch {
      return '';
    }
  };
  const refTrace = (n: Name) => or(() => traceHash(refereeTrace(config, sides[n].record.stage, c[n].input)));
  const bad = names.filter((n) => or(() => recordId(parseRecord(c[n].record))) !== recordId(sides[n].record) || c[n].trace !== refTrace(n));
  if (bad.length > 0) return { losers: bad, mode, reason: 'its committed step is not the record\'s forward of the section (another record, or another trace)' };
  const step = refereeTrace(config, a.record.stage, c.a.input);
  cost.ops = step.ops.length;
  const from = producers(step);
  const outSlot = step.outputSlots[0];
  const misfit = names.filter((n) => c[n].output !== outSlot || c[n].size !== step.slots.length);
  if (misfit.length > 0) throw new SideFailed(misfit, 'its commitment names another output slot or number of values');
  const hashes: Record<Name, Map<number, string>> = { a: new Map(), b: new Map() };
  const leafOfSide = async (n: Name, slot: number): Promise<string> => {
    const known = hashes[n].get(slot);
    if (known !== undefined) return known;
    const [leaf] = await sides[n].leaves([slot]);
    cost.leaves++;
    if (!leaf || leaf.slot !== slot || typeof leaf.value !== 'string' || !verifyProof(c[n].root, c[n].size, slot, leafOf(slot, leaf.value), leaf.proof)) {
      throw new SideFailed([n], `its leaf of slot ${slot} is not in the tree it committed to`);
    }
    // the output it signed is its output slot's value: a side is bound by its signature first
    const value = slot === outSlot ? sides[n].record.output : leaf.value;
    hashes[n].set(slot, value);
    return value;
  };
  const values: Record<Name, Map<number, Tensor>> = { a: new Map(), b: new Map() };
  const valueOf = async (n: Name, slot: number): Promise<Tensor> => {
    const known = values[n].get(slot);
    if (known) return known;
    const want = await leafOfSide(n, slot);
    const t = await sides[n].value(slot);
    cost.values++;
    if (hashTensors([t]) !== want) throw new SideFailed([n], `its value of slot ${slot} does not hash as it committed${slot === outSlot ? ' (the output it signed)' : ''}`);
    values[n].set(slot, t);
    return t;
  };
  const pair = <T>(what: string, f: (n: Name) => Promise<T>) => both(what, () => f('a'), () => f('b'));
  // the step's input is the one both records name
  const inputs = await pair('show their input leaf', (n) => leafOfSide(n, 0));
  const wrongInput = names.filter((n, k) => inputs[k] !== sides[n].record.input);
  if (wrongInput.length > 0) return { losers: wrongInput, mode, reason: 'its committed input is not the one its record names' };
  const differs = async (slot: number): Promise<boolean> => {
    const [ha, hb] = await pair(`show slot ${slot}`, (n) => leafOfSide(n, slot));
    if (ha === hb) return false;
    if (mode === 'exact' || step.slots[slot].kind !== 'result') return true;
    const [va, vb] = await pair(`hand over slot ${slot}`, (n) => valueOf(n, slot));
    return !close(va, vb);
  };
  const found = await bisect(step, from[outSlot], differs, cost);
  if (found.kind === 'slot') {
    return { losers: [], mode, inconclusive: true, reason: `the sides computed with different ${step.slots[found.slot].kind}s (slot ${found.slot}): not a dispute over an op; re-execute` };
  }
  const op = { index: found.op, name: step.ops[found.op].op };
  const rerun = (inputsOf: Map<number, Tensor>) => {
    cost.opsRerun++;
    return withBackend('js', () => noGrad(() => step.runOp(found.op, inputsOf)));
  };
  const opInputs = async (n: Name) => {
    const slots = step.ops[found.op].inputSlots;
    return new Map(await Promise.all(slots.map(async (s) => [s, await valueOf(n, s)] as const)));
  };
  const outSlots = step.ops[found.op].outputSlots;
  if (mode === 'exact') {
    // the inputs agree bit for bit: fetched from one side, checked against its leaves (which are the other's)
    const outs = rerun(await opInputs('a'));
    const mine = outs.map((t) => hashTensors([t]));
    const [oa, ob] = await pair('show the op\'s outputs', (n) => Promise.all(outSlots.map((s) => leafOfSide(n, s))));
    return { ...judgeOp(op, { a: oa.every((h, k) => h === mine[k]), b: ob.every((h, k) => h === mine[k]) }), mode };
  }
  // across backends: each side's outputs must be what the op gives from its own inputs, within tolerance
  const [ia, ib] = await pair('hand over the op\'s inputs', opInputs);
  const [oa, ob] = await pair('hand over the op\'s outputs', (n) => Promise.all(outSlots.map((s) => valueOf(n, s))));
  const [ra, rb] = [rerun(ia), rerun(ib)];
  return { ...judgeOp(op, { a: ra.every((t, k) => close(t, oa[k])), b: rb.every((t, k) => close(t, ob[k])) }), mode };
}

/**
 * Runs a dispute to its end: a side that fails to answer, answers late (past its timeout) or
 * answers with something its commitment does not prove loses; both sides are closed after.
 */
export async function runDispute(config: ModelConfig, sides: Record<Name, DisputeSide>): Promise<DisputeVerdict> {
  const cost: DisputeCost = { ops: 0, opsRerun: 0, compared: 0, leaves: 0, values: 0, bytes: 0 };
  let outcome: DisputeOutcome & { mode: DisputeVerdict['mode'] };
  const mode = sides.a.record.backend === 'js' && sides.b.record.backend === 'js' ? 'exact' : 'tolerance';
  try {
    outcome = await settle(config, sides, cost);
  } catch (err) {
    if (!(err instanceof SideFailed)) throw err;
    // both silent at once is more likely the referee's own trouble (its network) than two cheats: no evidence
    const silent = err.sides.length === 2;
    outcome = { losers: silent ? [] : err.sides, mode, reason: err.message, ...(silent ? { inconclusive: true } : {}) };
  } finally {
    await Promise.all([sides.a.close(), sides.b.close()]);
  }
  cost.bytes = sides.a.bytes + sides.b.bytes;
  return { ...outcome, cost };
}

/** A side of a dispute over the stage protocol: a worker answering for the values of a forward it signed. */
async function remoteSide(node: Libp2p, worker: PeerTarget, record: WorkRecord, timeoutMs: number): Promise<DisputeSide> {
  const which = { jobId: record.job, kind: record.kind, step: record.step, micro: record.micro };
  const stream = await openStageStream(node, worker, { what: 'dispute', fields: which, timeoutMs });
  const call = stream.call;
  const message = async (header: Record<string, unknown>) => {
    const frame = await call(header);
    if (frame.kind !== 'control') throw new InvalidMessageError(`${String(header.type)}: expected a control answer`);
    return frame.message as Record<string, unknown>;
  };
  return {
    peer: worker.peerId,
    record,
    get bytes() {
      return stream.bytes;
    },
    open: async () => (await message({ type: 'dispute-open' })) as unknown as Commit,
    leaves: async (slots) => {
      const m = await message({ type: 'dispute-leaves', slots });
      if (!Array.isArray(m.leaves)) throw new InvalidMessageError('dispute-leaves: no leaves');
      return m.leaves as Leaf[];
    },
    value: async (slot) => {
      const frame = await call({ type: 'dispute-value', slot });
      if (frame.kind !== 'tensor') throw new InvalidMessageError('dispute-value: expected a tensor');
      return fromWire(frame.tensor);
    },
    close: async () => {
      await call({ type: 'dispute-close' }).catch(() => {});
      await stream.close();
    },
  };
}

/** What a user (or a check that disagreed) asks the validator to settle: two workers' records of the same forward. */
export interface DisputeRequest {
  jobId: string;
  /** The model's config (Hugging Face form): the user's, not the workers' word. */
  config: Record<string, unknown>;
  a: { worker: PeerTarget; record: WorkRecord };
  b: { worker: PeerTarget; record: WorkRecord };
}

/** Parses a `dispute` control message (a typed error naming what is wrong). */
export function parseDispute(m: Record<string, unknown>): DisputeRequest {
  const side = (v: unknown, what: string) => {
    const s = obj(v, what);
    return { worker: parsePeerTarget(s.worker, `${what}.worker`), record: parseRecord(s.record) };
  };
  return { jobId: parseJobId(m.jobId), config: obj(m.config, 'config'), a: side(m.a, 'a'), b: side(m.b, 'b') };
}

/**
 * Settles a dispute between two workers' forward records (see `settle`) and scores both: a loser's
 * reputation takes a failed check naming the op, a winner a passed one; an inconclusive end moves
 * nothing. Both records must be signed by their workers, of the request's job and config, and of
 * the same computation (section, micro-batch, input, weights) with different outputs.
 */
export async function dispute(
  node: Libp2p,
  reputation: Reputation,
  req: DisputeRequest,
  timeoutMs = DISPUTE_TIMEOUT_MS,
): Promise<DisputeVerdict & { peers: Record<Name, string> }> {
  const { a, b } = req;
  for (const s of [a, b]) {
    const r = s.record;
    if (r.peer !== s.worker.peerId || !signatureValid(r, publicKeyOf(s.worker.peerId))) {
      throw new InvalidMessageError(`a disputed record is not signed by ${s.worker.peerId}`);
    }
    if (r.job !== req.jobId || (r.config !== undefined && jobConfigHash(req.config) !== r.config)) {
      throw new InvalidArgumentError('a disputed record is of another job or config');
    }
    if (r.kind !== 'forward') throw new InvalidArgumentError(`only forward records are disputed, not '${r.kind}'`);
  }
  const [x, y] = [a.record, b.record];
  if (`${x.stage}` !== `${y.stage}` || x.micro !== y.micro || x.step !== y.step || x.input !== y.input || x.weights !== y.weights) {
    throw new InvalidArgumentError('the disputed records are not of the same computation (section, micro-batch, input and weights)');
  }
  if (x.output === y.output) throw new InvalidArgumentError('the disputed records agree: there is nothing to settle');
  const peers = { a: a.worker.peerId, b: b.worker.peerId };
  const open = async (s: typeof a): Promise<DisputeSide> => {
    try {
      return await remoteSide(node, s.worker, s.record, timeoutMs);
    } catch (err) {
      // out of reach: it cannot answer for its values, and loses when the referee asks
      const fail = () => Promise.reject(err as Error);
      return { peer: s.worker.peerId, record: s.record, bytes: 0, open: fail, leaves: fail, value: fail, close: async () => {} };
    }
  };
  const verdict = await runDispute(configFromHF(req.config), { a: await open(a), b: await open(b) });
  const pairKey = createHash('sha256').update(`${recordId(a.record)}:${recordId(b.record)}`).digest('hex');
  if (!verdict.inconclusive) {
    for (const n of ['a', 'b'] as const) {
      const lost = verdict.losers.includes(n);
      const why = lost ? `dispute over forward ${x.step}:${x.micro}: ${verdict.reason}` : undefined;
      // counted once per record and what it was disputed against: a win over an absent second identity does not
      // shield a record from an honest dispute after
      reputation.check(peers[n], !lost, why, `dispute:${pairKey}:${n}`);
    }
  }
  return { ...verdict, peers };
}

/** Disputes a validator settles at once, and how many may wait (in all, and per peer that asked). */
export const DISPUTE_LIMITS = { running: 1, waiting: 16, perPeer: 2 };

/**
 * The validator's `dispute` handler: settles, logs the op it ended at and its cost, and lists the loser's failed check.
 * One at a time, a bounded queue; the same dispute asked again while it runs waits for it (each side's record moves its
 * worker's reputation once, however often it is disputed).
 */
export function disputeHandler(node: Libp2p, reputation: Reputation, log: Logger, events: EventLog, settler: Settler | null = null) {
  type Answer = Awaited<ReturnType<typeof dispute>>;
  const queue = new CheckQueue<Answer>(DISPUTE_LIMITS, () => false, 'disputes');
  return async (m: Record<string, unknown>, from: PeerId) => {
    const req = parseDispute(m);
    const key = createHash('sha256').update(`${recordId(req.a.record)}:${recordId(req.b.record)}`).digest('hex');
    const { value: v, replayed } = await queue.run(from.toString(), key, () => dispute(node, reputation, req));
    if (replayed) return { type: 'dispute-result', ...v, losers: v.losers.map((n) => v.peers[n]) };
    const op = v.op ? `op ${v.op.index} '${v.op.name}'` : 'no op';
    log.warn('dispute-settled', { losers: v.losers.map((n) => v.peers[n]), op, reason: v.reason, mode: v.mode, ...v.cost });
    for (const n of v.losers) {
      events.add('check-failed', v.peers[n], `dispute: ${v.reason}`);
      // a lost dispute is evidence, as a failed re-execution is: the loser's stake is cut (in the background), its record the evidence
      const record = n === 'a' ? req.a.record : req.b.record;
      settler?.slash(record).then(() => events.add('slashed', v.peers[n], `stake cut for a lost dispute (${op})`))
        .catch((err: unknown) => log.warn('slash-failed', { peer: v.peers[n], error: (err as Error).message }));
    }
    return { type: 'dispute-result', ...v, losers: v.losers.map((n) => v.peers[n]) };
  };
}
