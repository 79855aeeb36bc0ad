import { InvalidArgumentError, InvalidMessageError, VerificationError } from '../errors.ts';
import type { PeerTarget } from '../p2p/index.ts';
import { type Activation, isPassed, type ReduceGroup, type StageHandle } from '../pipeline/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { agree, type WorkRecord } from '../verify/index.ts';
import type { Recorded, RemoteTrainStage } from './remote-train.ts';
import type { JobVerifier } from './verifier.ts';

/** Copies of a stage are each sent the tensor by the user: one passed between workers cannot reach them all. */
function held(x: Activation): Tensor {
  if (isPassed(x)) throw new InvalidArgumentError(`a redundant stage cannot take a tensor passed between workers (${x.key})`);
  return x;
}

/** Whether two redundant results are the same: bit for bit on js (their records' hashes), within ORT_TOLERANCE on ort. */
function sameResult(a: Recorded<Tensor | null>, b: Recorded<Tensor | null>): boolean {
  if (a.record.backend === 'js' && b.record.backend === 'js') return a.record.output === b.record.output && a.record.grads === b.record.grads;
  if (!a.value || !b.value) return a.value === b.value;
  return agree('ort', a.value.data as Float32Array, b.value.data as Float32Array);
}

/** Whether two step records agree: on js the gradients, the state before and after and the weights after are the same. */
function sameStep(a: Recorded<null>, b: Recorded<null>): boolean {
  const [x, y] = [a.record, b.record];
  if (x.backend !== 'js' || y.backend !== 'js') return true; // ort steps drift within tolerance: the next results are compared
  return x.input === y.input && x.state === y.state && x.output === y.output && x.after === y.after;
}

/** Two copies' records of the same computation, for a dispute. */
export interface DisputedCopy {
  worker: PeerTarget;
  record: WorkRecord;
}

/**
 * What a verifier offers that settles two disagreeing forwards by bisection (the validator's `dispute`,
 * validator/dispute.ts): the peers that lost, or inconclusive (then the records are re-executed). It counts
 * the losers as flagged and excluded, as `audit` does for a failed check.
 */
export interface Disputes {
  dispute(a: DisputedCopy, b: DisputedCopy): Promise<{ losers: string[]; inconclusive?: boolean; reason: string }>;
}

/**
 * One section of a training job on k workers (security level k) that compute the same
 * micro-batches: each result is accepted only when the copies agree. When two forwards do not and the
 * verifier settles disputes (Disputes), the validator bisects to one op and re-runs it; otherwise (or
 * when that is inconclusive) it re-runs every copy's record from what that worker kept; the workers whose record
 * does not reproduce are flagged (`onFlag` excludes them from the job) and the step goes on
 * with a result that did. With k = 1 it is one worker, its records checked on arrival.
 */
export class RedundantStage implements StageHandle {
  constructor(
    readonly lanes: RemoteTrainStage[],
    private readonly verifier: JobVerifier & Partial<Disputes>,
    private readonly onFlag: (lane: RemoteTrainStage, reason: string) => Promise<void>,
  ) {
    for (const lane of lanes) lane.onRecord = (stage, record) => verifier.observe(stage.worker, record);
  }

  /** The first worker still trusted: generation, checkpoints and reductions use it. */
  get primary(): RemoteTrainStage {
    return this.lanes[0];
  }

  get label(): string {
    return this.lanes.length > 1 ? `${this.primary.label} and ${this.lanes.length - 1} redundant` : this.primary.label;
  }

  get address(): string {
    return this.primary.address;
  }

  get names(): readonly string[] {
    return this.primary.names;
  }

  /** Runs `op` on every copy; the agreed result, or the one the validator's re-execution confirms. */
  private async agreed<T extends Tensor | null>(
    what: string,
    op: (lane: RemoteTrainStage) => Promise<Recorded<T>>,
    same: (a: Recorded<T>, b: Recorded<T>) => boolean,
  ): Promise<T> {
    const all = [...this.lanes];
    if (all.length === 1) return (await op(all[0])).value;
    // a copy whose record is forged or about something else leaves the job; the others go on
    const settled = await Promise.allSettled(all.map(op));
    const lanes: RemoteTrainStage[] = [];
    const results: Recorded<T>[] = [];
    for (const [i, s] of settled.entries()) {
      if (s.status === 'fulfilled') {
        lanes.push(all[i]);
        results.push(s.value);
      } else if (s.reason instanceof VerificationError || s.reason instanceof InvalidMessageError) {
        this.verifier.excluded.add(all[i].peerId);
        await this.flag(all[i], `${what}: ${(s.reason as Error).message}`);
      } else throw s.reason;
    }
    if (results.length === 0) throw new VerificationError(`no copy of ${this.primary?.label ?? 'a section'}'s ${what} came with a valid record`);
    if (results.length === 1) return results[0].value;
    this.verifier.summary.compared++;
    if (results.every((r) => same(r, results[0]))) return results[0].value;
    const won = await this.disputed(what, lanes, results);
    if (won) return won.value;
    const verdicts = await Promise.all(results.map((r, i) => this.verifier.audit(lanes[i].worker, r.record)));
    let accepted: Recorded<T> | null = null;
    for (const [i, v] of verdicts.entries()) {
      if (v.ok) accepted ??= results[i];
      else await this.flag(lanes[i], `${what}: ${v.reason}`);
    }
    if (!accepted) throw new VerificationError(`no copy of ${this.primary.label}'s ${what} could be reproduced by the validator`);
    // copies that passed must also agree with the accepted one
    for (const [i, r] of results.entries()) {
      if (verdicts[i].ok && r !== accepted && !same(r, accepted)) await this.flag(lanes[i], `${what}: disagrees with a reproduced result`);
    }
    return accepted.value;
  }

  /**
   * Two forwards that disagree, settled by a dispute where the verifier offers them: the losers are
   * flagged and the other copy's result is taken. Null (re-execute as before) for anything else, or
   * when the dispute cannot decide or the validator cannot hold one.
   */
  private async disputed<T>(what: string, lanes: RemoteTrainStage[], results: Recorded<T>[]): Promise<Recorded<T> | null> {
    const dispute = this.verifier.dispute?.bind(this.verifier);
    if (!dispute || results.length !== 2 || results.some((r) => r.record.kind !== 'forward')) return null;
    const copy = (i: number): DisputedCopy => {
      const { peerId, addrs } = lanes[i].worker;
      return { worker: { peerId, addrs }, record: results[i].record };
    };
    let verdict;
    try {
      verdict = await dispute(copy(0), copy(1));
    } catch {
      return null;
    }
    if (verdict.inconclusive || verdict.losers.length === 0) return null;
    const winner = results.findIndex((_, i) => !verdict.losers.includes(lanes[i].peerId));
    for (const lane of lanes) {
      if (verdict.losers.includes(lane.peerId)) await this.flag(lane, `${what}: lost a dispute: ${verdict.reason}`);
    }
    if (winner < 0) throw new VerificationError(`both copies of ${this.primary?.label ?? 'a section'}'s ${what} lost a dispute: ${verdict.reason}`);
    return results[winner];
  }

  private async flag(lane: RemoteTrainStage, reason: string): Promise<void> {
    const i = this.lanes.indexOf(lane);
    if (i < 0) return;
    this.lanes.splice(i, 1);
    this.verifier.forget(lane.peerId);
    await this.onFlag(lane, reason);
  }

  /** Its worker's peer id when it is one worker that takes tensors from its neighbours (copies compare what they return). */
  get direct(): string | undefined {
    return this.lanes.length === 1 ? this.primary.direct : undefined;
  }

  forward(micro: number, input: Activation, to?: string): Promise<Activation> {
    if (this.lanes.length === 1) return this.primary.forward(micro, input, to);
    return this.agreed(`forward of micro-batch ${micro}`, (l) => l.forwardRecorded(micro, held(input)) as Promise<Recorded<Tensor>>, sameResult);
  }

  backward(micro: number, grad: Activation, to?: string): Promise<Activation | null> {
    if (this.lanes.length === 1) return this.primary.backward(micro, grad, to);
    return this.agreed(`backward of micro-batch ${micro}`, (l) => l.backwardRecorded(micro, held(grad)) as Promise<Recorded<Tensor | null>>, sameResult);
  }

  gradSquares(names: readonly string[]): Promise<number[]> {
    return this.primary.gradSquares(names);
  }

  async reduce(group: ReduceGroup): Promise<void> {
    if (this.lanes.length > 1) throw new InvalidArgumentError('redundancy with replicas, or with a tied head split across workers, is not supported yet');
    await this.primary.reduce(group);
  }

  async sync(group: ReduceGroup): Promise<string> {
    if (this.lanes.length > 1) throw new InvalidArgumentError('redundancy with local steps among replicas is not supported yet');
    return this.primary.sync(group);
  }

  async step(scale: number, lr: number): Promise<void> {
    await this.agreed('optimizer step', async (l) => ({ value: null, record: await l.stepRecorded(scale, lr) as WorkRecord }), sameStep);
  }

  weights(): Promise<Map<string, Tensor>> {
    return this.primary.weights();
  }

  optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>> {
    return this.primary.optimizerState();
  }

  async setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void> {
    await Promise.all(this.lanes.map((l) => l.setOptimizerState(state)));
  }

  async reset(): Promise<void> {
    await Promise.all(this.lanes.map((l) => l.reset()));
  }
}
