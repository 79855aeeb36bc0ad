import { InvalidArgumentError, InvalidMessageError, PeerUnreachableError, StageFailedError, VerificationError } from '../errors.ts';
import { publicKeyOf, type StageAssignment } from '../p2p/index.ts';
import { cutStep } from '../models/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { agree, auxHash, checkRecord, type ComputeFormat, hashTensors, parseRecord, sessionStepHash, type WorkRecord } from '../verify/index.ts';
import type { JobStage } from './job-stage.ts';
import { MAX_FAILOVERS, type SessionProgress } from './failover.ts';
import type { ResultInbox } from './result-inbox.ts';
import { cameBack, passedOn } from './remote-stage.ts';
import type { JobVerifier } from './verifier.ts';

/**
 * While a chained step is under way, the user looks this often at the stage streams of its route:
 * a worker that dies leaves its stream closed, and the chain's result would never come, so the
 * step fails at once instead of at its deadline (seconds, and at least DEADLINE_FLOOR_MS).
 */
export const CHAIN_WATCH_MS = 50;

/** What a session's steps run on: the job's sections (copies), how results come back, and who checks them. */
export interface SessionContext {
  /** The job's id and sections as they are now (a failover may replace a worker or plan the job again). */
  jobId(): string;
  sections(): JobStage[][];
  inbox: ResultInbox | null;
  verifier: JobVerifier | null;
  /** What the job's matrices are held in: copies computed on ort agree within that format's tolerance (ortTolerance). */
  format: ComputeFormat;
  /** A worker caught: it leaves the job. */
  exclude(stage: JobStage): Promise<void>;
  /** The deadline of a step of `tokens` tokens through every section, in milliseconds. */
  deadlineMs(tokens: number): number;
  /**
   * A step failed with `cause` (attempt 0, 1, ...): the job replaces the workers it finds lost, or
   * waits a backoff when none is, or throws the typed error that ends the session (no live worker
   * can take a section). The session is then rebuilt on the route as it is.
   */
  recover(cause: unknown, attempt: number, progress: SessionProgress): Promise<void>;
  /** The first step after a failover is done: the job notes how long recovery took and what was replayed. */
  recovered(replayed: number): void;
}

/**
 * The workers' part of one session's steps, every result checked by its signed record:
 * each stage's record must be its worker's, about this session and position, name the input
 * it was sent (the previous stage's output: the chain) and the output that came back. In a
 * chain the records travel with the output worker to worker; with redundancy k every
 * section's copies run the step and must agree (bit for bit on js), a disagreement settled by
 * the validator re-running each copy's step from the session's inputs. Sampled records are
 * handed to the verifier with the inputs the session sent each worker (its audit's evidence).
 */
export class SessionSteps {
  /** The session's position: the first position of the next step. */
  private position = 0;
  /** Every step's input so far (after the user's first end): a new worker rebuilds its KV cache by replaying them. */
  private readonly history: { x: Tensor; positions: Tensor; keyMask: Tensor | null }[] = [];
  /** Every session id used on the workers (a failover starts a new one): all are closed with the session. */
  readonly sessionIds: string[];
  /** The session's id on the workers now. */
  sessionId: string;
  /** The weights each worker named in this session's first step. */
  private readonly weights = new Map<string, string>();
  /** The hashes of the inputs sent to each worker in this session, in order. */
  private readonly sent = new Map<string, string[]>();

  constructor(
    private readonly ctx: SessionContext,
    sessionId: string,
    /** Makes the id of the session a failover opens on the new route. */
    private readonly newId: () => string = () => `${sessionId}-${this.sessionIds.length}`,
  ) {
    this.sessionId = sessionId;
    this.sessionIds = [sessionId];
  }

  /** `came`: what the record must name for the tensor that came back (its output, or with a codec what it sent); none mid-chain. */
  private check(
    worker: StageAssignment, raw: unknown, input: string, came: { output: string } | { sent: string } | null, shape?: readonly number[],
  ): WorkRecord {
    const record = parseRecord(raw);
    const aux = this.aux!;
    checkRecord(record, publicKeyOf(worker.peerId), {
      job: this.ctx.jobId(), peer: worker.peerId, kind: 'decode', step: this.position, micro: 0, input, ...came,
      stage: [worker.start, worker.end], session: this.sessionId, aux,
    });
    // a worker computes a whole session with the same weights
    const weights = this.weights.get(worker.peerId);
    if (weights !== undefined && weights !== record.weights) throw new VerificationError(`${worker.peerId} changed its weights in the middle of a session`);
    this.weights.set(worker.peerId, record.weights);
    // what this worker was sent in this session, step by step: an audit's evidence that it cannot swap its past
    const list = this.sent.get(worker.peerId) ?? [];
    list.push(sessionStepHash(input, aux));
    this.sent.set(worker.peerId, list);
    // the hashes up to this step (the list grows with the session's later steps)
    const upTo = list.length;
    const observe = () => this.ctx.verifier?.observe(worker, record, () => list.slice(0, upTo), shape ? { shape } : undefined);
    // a speculative pass's records wait: cut to its accepted positions, they are signed again (keep)
    if (this.deferred) this.deferred.push({ peer: worker.peerId, observe });
    else observe();
    return record;
  }

  /** The records of a speculative pass not yet kept whole or cut (null when the last step was no pass). */
  private deferred: { peer: string; observe: () => void }[] | null = null;
  /** The workers' output of the last step (before the user's last end): a pass cut short is checked against its start. */
  private lastOut: Tensor | null = null;

  /** The last pass was kept whole (a step came after it, or the session ends): its records go to the verifier. */
  settle(): void {
    const pending = this.deferred ?? [];
    this.deferred = null;
    for (const p of pending) p.observe();
  }

  /**
   * Keeps the first `length` positions of the session (a speculative pass's accepted ones): every worker drops the
   * rest of the pass from its KV cache and signs the pass again for the positions kept, which is checked here as a step
   * of them alone would be (the chain, the input sent, the output that came back cut alike) and replaces the pass in
   * what the verifier samples and in the session's history. A worker lost on the way is failed over as a step's is:
   * the history, already cut, is replayed on the new route.
   */
  async keep(length: number): Promise<void> {
    const pending = this.deferred;
    this.deferred = null;
    const last = this.history.at(-1);
    const steps = last?.x.shape[1] ?? 1;
    const from = this.position - steps;
    if (!last || !pending || !this.lastOut || length <= from || length > this.position) {
      throw new InvalidArgumentError(`a session at position ${this.position} cannot keep ${length}: only its last speculative pass can be cut`);
    }
    if (length === this.position) {
      for (const p of pending) p.observe();
      return;
    }
    const keep = length - from;
    const step = cutStep(last, keep, ['x']);
    this.history[this.history.length - 1] = step;
    const out = this.lastOut.narrow(1, 0, keep).contiguous();
    for (let attempt = 0; ; attempt++) {
      try {
        if (attempt === 0) await this.keepOnce(from, length, step, out, pending);
        else {
          this.restart();
          let y: Tensor | null = null;
          for (const h of this.history) y = await this.runOnce(h.x, h.positions, h.keyMask);
          // the tokens were taken from the pass's output: the route that replays the session must give it again
          if (!y || !agree('ort', y.data as Float32Array, out.data as Float32Array, this.ctx.format)) {
            throw new VerificationError('the session replayed after a failover does not give the output its accepted tokens came from: a lost worker computed them wrong');
          }
          this.lastOut = y;
          this.ctx.recovered(this.history.length);
        }
        return;
      } catch (err) {
        if (attempt >= MAX_FAILOVERS) {
          throw new StageFailedError(`cutting a speculative pass failed ${attempt + 1} times in a row: ${(err as Error).message}`, { cause: err });
        }
        await this.ctx.recover(err, attempt, { sessionId: this.sessionId, position: length });
      }
    }
  }

  /**
   * Asks every worker of the route to cut the pass and checks what each signed again. A worker that does not answer
   * with a valid record of the positions kept has its pass's record handed to the verifier instead (what it computed
   * for the tokens taken is checked either way); the first failure is then thrown.
   */
  private async keepOnce(
    from: number, length: number, step: { x: Tensor; positions: Tensor; keyMask: Tensor | null }, out: Tensor,
    pending: { peer: string; observe: () => void }[],
  ): Promise<void> {
    if ((this.ctx.verifier?.redundancy ?? 1) > 1) throw new InvalidArgumentError('speculative decoding does not combine with --redundancy yet');
    const route = this.ctx.sections().map((copies) => copies[0]);
    const answers = await Promise.allSettled(route.map((s) => s.remote.truncateSession(this.sessionId, length)));
    const aux = auxHash(step.positions, step.keyMask);
    let input = hashTensors([step.x]);
    let failure: unknown = null;
    answers.forEach((answer, i) => {
      const worker = route[i].where;
      try {
        if (answer.status === 'rejected') throw answer.reason;
        const record = parseRecord(answer.value);
        checkRecord(record, publicKeyOf(worker.peerId), {
          job: this.ctx.jobId(), peer: worker.peerId, kind: 'decode', step: from, micro: 0, input, stage: [worker.start, worker.end],
          session: this.sessionId, aux, ...(i === route.length - 1 ? { output: hashTensors([out]) } : {}),
        });
        if (this.weights.get(worker.peerId) !== record.weights) throw new VerificationError(`${worker.peerId} changed its weights in the middle of a session`);
        // the pass's step hash gives way to the kept positions'
        const list = this.sent.get(worker.peerId) ?? [];
        list[list.length - 1] = sessionStepHash(input, aux);
        const upTo = list.length;
        this.ctx.verifier?.observe(worker, record, () => list.slice(0, upTo), { shape: step.x.shape });
        input = record.output;
      } catch (err) {
        failure ??= err;
        for (const p of pending) if (p.peer === worker.peerId) p.observe();
      }
    });
    if (failure !== null) throw failure;
    this.position = length;
    this.lastOut = out;
  }

  /** The hash of the positions and key mask of the step under way. */
  private aux: string | null = null;

  /**
   * Runs hidden states (or ids) `x` through every section for this step. A worker lost on the
   * way (its stream closed, or no result before the step's deadline) is replaced by the job;
   * the session then starts again on the new route and replays its earlier steps, so every
   * worker's KV cache holds what it held before, and the step is run again: the result is the
   * one an undisturbed session gives (bit for bit on js). A failure with no worker lost is
   * retried after a backoff, a few times.
   */
  async run(x: Tensor, positions: Tensor, keyMask: Tensor | null, pass = false): Promise<Tensor> {
    // a step after a speculative pass means the pass was kept whole
    this.settle();
    let replayed = 0;
    for (let attempt = 0; ; attempt++) {
      // the step under way (a replayed one, or this one): where it would leave the session
      let ends = this.position + (x.shape[1] ?? 1);
      try {
        if (attempt > 0) {
          // a new session on the route as it is now, every earlier step replayed: the stages that ran part of the
          // failed step hold it in their caches, so even a retry on the same workers starts clean
          this.restart();
          for (const h of this.history) {
            ends = this.position + (h.x.shape[1] ?? 1);
            await this.runOnce(h.x, h.positions, h.keyMask);
          }
          replayed += this.history.length;
          ends = this.position + (x.shape[1] ?? 1);
        }
        this.deferred = pass ? [] : null;
        const out = await this.runOnce(x, positions, keyMask);
        this.lastOut = out;
        this.history.push({ x, positions, keyMask });
        if (attempt > 0) this.ctx.recovered(replayed);
        return out;
      } catch (err) {
        this.deferred = null;
        if (attempt >= MAX_FAILOVERS) throw new StageFailedError(`a decoding step failed ${attempt + 1} times in a row: ${(err as Error).message}`, { cause: err });
        await this.ctx.recover(err, attempt, { sessionId: this.sessionId, position: ends });
      }
    }
  }

  /** A new session on the workers as they are now: nothing computed yet. */
  private restart(): void {
    this.sessionId = this.newId();
    this.sessionIds.push(this.sessionId);
    this.position = 0;
    this.weights.clear();
    this.sent.clear();
  }

  private async runOnce(x: Tensor, positions: Tensor, keyMask: Tensor | null): Promise<Tensor> {
    const steps = x.shape[1] ?? 1;
    this.aux = auxHash(positions, keyMask);
    const redundancy = this.ctx.verifier?.redundancy ?? 1;
    const tensors = (t: Tensor) => (keyMask ? [t, positions, keyMask] : [t, positions]);
    let out: Tensor;
    if (this.ctx.inbox && redundancy === 1) {
      const route = this.ctx.sections().map((copies) => copies[0]);
      const deadline = this.ctx.deadlineMs(steps * x.shape[0]);
      const { requestId, result } = this.ctx.inbox.expect(new Set(route.map((s) => s.where.peerId)), deadline);
      const sent = await route[0].remote.forwardChained(this.sessionId, tensors(x), route.slice(1).map((s) => s.where.peerId), requestId);
      const answer = await this.unlessClosed(route, result);
      if (answer.records.length !== route.length) {
        throw new VerificationError(`the chain returned ${answer.records.length} records for its ${route.length} stages`);
      }
      // each stage's input is what its predecessor sent (its output, or with a codec that output as decoded): the chain;
      // only the user's own input and the last output are tensors here
      let input = sent.input;
      answer.records.forEach((raw, i) => {
        const came = i === route.length - 1 ? cameBack(sent.codec, hashTensors([answer.output])) : null;
        const record = this.check(route[i].where, raw, input, came, x.shape);
        input = passedOn(sent.codec, record);
      });
      out = answer.output;
    } else {
      out = x;
      for (const copies of this.ctx.sections()) out = await this.stage(copies.slice(0, redundancy), out, positions, keyMask);
    }
    this.position += steps;
    return out;
  }

  /**
   * `result`, or a PeerUnreachableError (a loss: the job fails over) as soon as the stage stream
   * of a stage on `route` is no longer open.
   */
  private async unlessClosed<T>(route: JobStage[], result: Promise<T>): Promise<T> {
    let timer: ReturnType<typeof setInterval> | undefined;
    const closed = new Promise<never>((_, reject) => {
      timer = setInterval(() => {
        const gone = route.find((s) => !s.remote.open);
        if (gone) reject(new PeerUnreachableError(`${gone.where.peerId}: its stage stream closed during a chained step`, { details: { peer: gone.where.peerId } }));
      }, CHAIN_WATCH_MS);
    });
    try {
      return await Promise.race([result, closed]);
    } finally {
      clearInterval(timer);
    }
  }

  /** One section's step on its copies (relayed by the user); the result they agree on or the validator confirms. */
  private async stage(copies: JobStage[], x: Tensor, positions: Tensor, keyMask: Tensor | null): Promise<Tensor> {
    const run = async (s: JobStage) => {
      const deadline = this.ctx.deadlineMs(x.shape[0] * (x.shape[1] ?? 1));
      const { output, record, input, expect } = await s.remote.forwardRecorded(this.sessionId, x, positions, keyMask, deadline);
      return { s, output, record: this.check(s.where, record, input, expect, x.shape) };
    };
    if (copies.length === 1) return (await run(copies[0])).output;
    const verifier = this.ctx.verifier!;
    // a copy whose record is forged or about something else leaves the job; the others go on
    const settled = await Promise.allSettled(copies.map(run));
    const results: Awaited<ReturnType<typeof run>>[] = [];
    for (const [i, s] of settled.entries()) {
      if (s.status === 'fulfilled') results.push(s.value);
      else if (s.reason instanceof VerificationError || s.reason instanceof InvalidMessageError) {
        verifier.excluded.add(copies[i].where.peerId);
        await this.ctx.exclude(copies[i]);
      } else throw s.reason;
    }
    if (results.length === 0) throw new VerificationError(`no copy of layers ${copies[0].where.start}–${copies[0].where.end - 1} came with a valid record`);
    if (results.length === 1) return results[0].output;
    verifier.summary.compared++;
    // int8/int4 copies are compared on what they added to the hidden states they were sent (see ORT_TOLERANCES)
    const base = x.dtype === 'float32' ? (x.data as Float32Array) : undefined;
    const same = (a: (typeof results)[number], b: (typeof results)[number]) =>
      a.record.backend === 'js' && b.record.backend === 'js'
        ? a.record.output === b.record.output
        : agree('ort', a.output.data as Float32Array, b.output.data as Float32Array, this.ctx.format, base);
    if (results.every((r) => same(r, results[0]))) return results[0].output;
    const verdicts = await Promise.all(results.map((r) => verifier.audit(r.s.where, r.record, [...this.sent.get(r.s.where.peerId)!])));
    let accepted: (typeof results)[number] | null = null;
    for (const [i, v] of verdicts.entries()) {
      if (v.ok) accepted ??= results[i];
      else {
        verifier.forget(results[i].s.where.peerId);
        await this.ctx.exclude(results[i].s);
      }
    }
    if (!accepted) throw new VerificationError(`no copy of layers ${copies[0].where.start}–${copies[0].where.end - 1} could be reproduced by the validator`);
    return accepted.output;
  }
}
