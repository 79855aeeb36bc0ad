import type { Libp2p } from '@libp2p/interface';
import { StageFailedError } from '../errors.ts';
import { type DialTarget, type PeerTarget, request } from '../p2p/index.ts';
import {
  backoffMs, type FailoverEvent, findLost, isLoss, latePeers, LIVENESS_TIMEOUT_MS, sectionLost, type SessionProgress, STEP_RETRIES,
} from './failover.ts';
import type { JobStage } from './job-stage.ts';
import { listWorkers } from './peers.ts';
import type { JobPlacement } from './placement.ts';
import type { JobVerifier } from './verifier.ts';

/**
 * A worker lost this recently is not planned onto again: a validator lists a worker until its
 * announcements stop for 10 s, so a dead one is still listed for a while. A worker that comes
 * back (restarted with its identity) is used again after this.
 */
export const LOST_AVOID_MS = 20_000;

/** What recovery needs of the job beyond its placement: whether it trains, and how it is rebuilt then. */
export interface RecoveryHost {
  /** Whether the job trains: its workers hold weights the user's source does not, and its stages move only all together. */
  trains(): boolean;
  /** A training job rebuilt from its last copy of its state on live workers, the steps since replayed (the trainer's heal). */
  heal(cause: unknown): Promise<void>;
}

/** How one failure is recovered from. */
export interface RecoverOptions {
  /** 'generation': a session's step, or a read of the job's weights; 'training': a step (the trainer rebuilds). */
  during?: FailoverEvent['during'];
  /** How the job is planned again without the lost workers (default: replaced, sections from the user's source). */
  rebuild?: (avoid: ReadonlySet<string>) => Promise<void>;
  /** Where the session stood (generation): a late chained step is blamed on the first stage behind. */
  progress?: SessionProgress;
}

/**
 * How a job goes on after losing a worker: it finds which workers are lost, moves a lone lost
 * section of a generation to a spare worker or places the job again, avoids the lost workers for
 * a while, and records each failover (what was lost, why, how the job went on, how long it took).
 */
export class JobRecovery {
  /** Workers lost in this job and when: a re-plan soon after avoids them (the validator lists a dead worker for a while). */
  private readonly lost = new Map<string, { at: number; target: PeerTarget; late: boolean }>();
  readonly failovers: FailoverEvent[] = [];
  /** Failovers whose first result after recovery has not come yet. */
  private recovering: FailoverEvent[] = [];

  constructor(
    private readonly node: Libp2p,
    private readonly placement: JobPlacement,
    private readonly verifier: JobVerifier | null,
    /** Where to ask for live workers (spares for a failover); null: the job cannot fail over to a spare. */
    private readonly validator: DialTarget | null,
    private readonly host: RecoveryHost,
  ) {}

  /**
   * Workers lost in the last LOST_AVOID_MS that still do not answer: a re-plan does not choose
   * them (the validator lists a dead worker until its announcements lapse). One that answers
   * again (restarted with its identity) may be chosen at once.
   */
  async recentlyLost(): Promise<Set<string>> {
    const now = Date.now();
    for (const [peer, l] of this.lost) if (now - l.at > LOST_AVOID_MS) this.lost.delete(peer);
    const back = await Promise.all([...this.lost].map(async ([peer, l]) => {
      if (l.late) return null;
      try {
        await request(this.node, l.target, { type: 'capabilities' }, LIVENESS_TIMEOUT_MS);
        return peer;
      } catch {
        return null;
      }
    }));
    for (const peer of back) if (peer) this.lost.delete(peer);
    return new Set(this.lost.keys());
  }

  /**
   * A step failed with `cause`: finds the workers that are lost (stream closed, or no answer to a
   * control request within LIVENESS_TIMEOUT_MS) and replaces them. A lone lost section of a
   * generation moves to a spare worker (it loads the section: content-addressed, only chunks it
   * lacks move); otherwise, or when no spare takes it, the job is planned again over the live
   * workers; when every worker answered, it waits a backoff (a training job is rebuilt on the same
   * workers). A training job that loses a worker outside a step (a generation, a read of its
   * weights) is healed by its trainer. The caller then rebuilds what the step left (a session
   * replays its steps). A typed StageFailedError, naming the section and the cause, when no live
   * worker can take it.
   */
  async recover(cause: unknown, attempt: number, options: RecoverOptions = {}): Promise<void> {
    const during = options.during ?? 'generation';
    const rebuild = options.rebuild ?? ((avoid) => this.placement.replan(avoid));
    if (!isLoss(cause)) throw cause;
    if (during === 'generation' && this.host.trains()) {
      // the workers hold trained weights the user's source does not: the trainer rebuilds the job from its copy
      await this.host.heal(cause);
      return;
    }
    const detectedAt = Date.now();
    const lost = await findLost(this.node, this.placement.all, this.placement.jobId, cause, options.progress);
    if (lost.length === 0) {
      if (attempt >= STEP_RETRIES) {
        throw new StageFailedError(`a step failed ${attempt + 1} times although every worker of the job answered: ${(cause as Error).message}`, { cause });
      }
      await new Promise((r) => setTimeout(r, backoffMs(attempt)));
      // a training step that failed part way leaves no state to go on from: rebuilt on the same workers
      if (during === 'training') await rebuild(await this.recentlyLost());
      return;
    }
    const late = latePeers(cause);
    for (const stage of lost) {
      const peer = stage.where.peerId;
      // one that missed a deadline answers as readily as a live one: it stays avoided for LOST_AVOID_MS
      const missed = late.has(peer) || (options.progress !== undefined && lost.length === 1 && stage.remote.open);
      this.lost.set(peer, { at: detectedAt, target: { peerId: peer, addrs: stage.where.addrs }, late: missed });
      // its records cannot be re-run any more; what it computed was checked on arrival
      this.verifier?.forget(stage.where.peerId);
      stage.remote.abort();
    }
    const events = lost.map((stage): FailoverEvent => ({
      during, peer: stage.where.peerId, layers: [stage.where.start, stage.where.end], cause: (cause as Error).message,
      action: 'spare', replacement: [], detectedAt, replayed: 0,
    }));
    const spare = lost.length === 1 && during === 'generation' && !this.host.trains() ? await this.moveToSpare(lost[0]) : null;
    if (spare) events[0].replacement = [spare];
    else {
      if (!this.placement.canReplan) throw sectionLost(lost[0], cause, 'this job cannot be planned again');
      // the survivors' sampled records belong to the job being closed: they can no longer be re-run
      this.verifier?.discardSampled();
      try {
        await rebuild(await this.recentlyLost());
      } catch (err) {
        throw sectionLost(lost[0], cause, `no live worker could take them: ${(err as Error).message}`);
      }
      for (const e of events) {
        e.action = 'replanned';
        e.replacement = this.placement.assignment.filter((a) => a.start < e.layers[1] && a.end > e.layers[0]).map((a) => a.peerId);
      }
    }
    this.failovers.push(...events);
    this.recovering.push(...events);
  }

  /** The first result after a failover came: how long recovery took (detection to that result) and what was replayed. */
  recovered(replayed: number): void {
    const now = Date.now();
    for (const e of this.recovering) {
      e.recoveredMs = now - e.detectedAt;
      e.replayed = replayed;
    }
    this.recovering = [];
  }

  /** Moves a lost stage to a live worker outside the job (tried in the validator's order); its peer id, or null if none took it. */
  private async moveToSpare(stage: JobStage): Promise<string | null> {
    if (!this.validator) return null;
    const avoid = await this.recentlyLost();
    const members = new Set(this.placement.all.map((s) => s.where.peerId));
    const spares = (await listWorkers(this.node, this.validator).catch(() => []))
      .filter((w) => !members.has(w.peerId) && !avoid.has(w.peerId) && !this.verifier?.excluded.has(w.peerId));
    const section = this.placement.sections.findIndex((copies) => copies.includes(stage));
    const replica = this.placement.sections[section].indexOf(stage);
    for (const w of spares) {
      try {
        await this.placement.replaceStage(section, replica, { peerId: w.peerId, addrs: w.addrs });
        return w.peerId;
      } catch {
        // it could not take the section (memory, gone meanwhile): the next one may
      }
    }
    return null;
  }
}
