import { VerificationError } from '../errors.ts';
import { type PeerTarget, publicKeyOf } from '../p2p/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { agree, checkRecord, hashTensors, parseRecord, type WorkRecord } from '../verify/index.ts';
import type { JobStage } from './job.ts';
import type { ResultInbox } from './result-inbox.ts';
import type { JobVerifier } from './verifier.ts';

/** What a session's steps run on: the job's sections (copies), how results come back, and who checks them. */
export interface SessionContext {
  jobId: string;
  sections: JobStage[][];
  inbox: ResultInbox | null;
  verifier: JobVerifier | null;
  /** A worker caught: it leaves the job. */
  exclude(stage: JobStage): Promise<void>;
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
  /** The hashes of the inputs sent to each worker in this session, in order. */
  private readonly sent = new Map<string, string[]>();

  constructor(
    private readonly ctx: SessionContext,
    readonly sessionId: string,
  ) {}

  private check(worker: PeerTarget, raw: unknown, input: string, output: string | undefined): WorkRecord {
    const record = parseRecord(raw);
    checkRecord(record, publicKeyOf(worker.peerId), {
      job: this.ctx.jobId, peer: worker.peerId, kind: 'decode', step: this.position, micro: 0, input, ...(output === undefined ? {} : { output }),
    });
    if (record.session !== this.sessionId) throw new VerificationError(`${worker.peerId}: the record names another session`);
    const list = this.sent.get(worker.peerId) ?? [];
    list.push(record.input);
    this.sent.set(worker.peerId, list);
    this.ctx.verifier?.observe(worker, record, () => [...list]);
    return record;
  }

  /** Runs hidden states (or ids) `x` through every section for this step. */
  async run(x: Tensor, positions: Tensor, keyMask: Tensor | null): Promise<Tensor> {
    const steps = x.shape[1] ?? 1;
    const redundancy = this.ctx.verifier?.redundancy ?? 1;
    const tensors = (t: Tensor) => (keyMask ? [t, positions, keyMask] : [t, positions]);
    let out: Tensor;
    if (this.ctx.inbox && redundancy === 1) {
      const route = this.ctx.sections.map((copies) => copies[0]);
      const { requestId, result } = this.ctx.inbox.expect(new Set(route.map((s) => s.where.peerId)));
      await route[0].remote.forwardChained(this.sessionId, tensors(x), route.slice(1).map((s) => s.where.peerId), requestId);
      const answer = await result;
      if (answer.records.length !== route.length) {
        throw new VerificationError(`the chain returned ${answer.records.length} records for its ${route.length} stages`);
      }
      let input = hashTensors([x]);
      answer.records.forEach((raw, i) => {
        input = this.check(route[i].where, raw, input, i === route.length - 1 ? hashTensors([answer.output]) : undefined).output;
      });
      out = answer.output;
    } else {
      out = x;
      for (const copies of this.ctx.sections) out = await this.stage(copies.slice(0, redundancy), out, positions, keyMask);
    }
    this.position += steps;
    return out;
  }

  /** One section's step on its copies (relayed by the user); the result they agree on or the validator confirms. */
  private async stage(copies: JobStage[], x: Tensor, positions: Tensor, keyMask: Tensor | null): Promise<Tensor> {
    const input = hashTensors([x]);
    const results = await Promise.all(copies.map(async (s) => {
      const { output, record } = await s.remote.forwardRecorded(this.sessionId, x, positions, keyMask);
      return { s, output, record: this.check(s.where, record, input, hashTensors([output])) };
    }));
    if (results.length === 1) return results[0].output;
    const verifier = this.ctx.verifier!;
    verifier.summary.compared++;
    const same = (a: (typeof results)[number], b: (typeof results)[number]) =>
      a.record.backend === 'js' && b.record.backend === 'js' ? a.record.output === b.record.output : agree('ort', a.output.data as Float32Array, b.output.data as Float32Array);
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
