import { randomUUID } from 'node:crypto';
import type { Libp2p } from '@libp2p/interface';
import { checkDctTopk, type DctTopkOptions } from '../compress/index.ts';
import { InvalidArgumentError, StageFailedError, VerificationError } from '../errors.ts';
import {
  type CausalLM, configToHF, defaultPositions, type GenerateOptions, generateWith, layerParameters, runLayers, type StepModel,
  saveModelStreamed,
} from '../models/index.ts';
import { addTraffic, newTraffic, type PeerTarget, request, type StageAssignment, type Traffic } from '../p2p/index.ts';
import { type PipelineStage, PipelineTrainer, type ScheduleName, userEnds } from '../pipeline/index.ts';
import type { Plan } from '../plan/index.ts';
import { noGrad, type Tensor, tensor } from '../tensor/index.ts';
import { type LoadProgress, type LoadResult, RemoteStage } from './remote-stage.ts';
import { tensorSource } from './section-source.ts';
import type { TrainingFailover } from './job-trainer.ts';
import { JobTrainer } from './job-trainer.ts';
import { RedundantStage } from './redundant-stage.ts';
import { RemoteTrainStage } from './remote-train.ts';
import { SessionSteps } from './session-steps.ts';
import { listWorkers } from './peers.ts';
import { ProgressReporter } from './progress.ts';
import {
  backoffMs, deadlineMs, type FailoverEvent, findLost, isLoss, latePeers, LIVENESS_TIMEOUT_MS, predictedSeconds, sectionLost,
  type SessionProgress, STEP_RETRIES,
} from './failover.ts';
import type { JobVerifier, VerificationSummary } from './verifier.ts';
import type { ResultInbox } from './result-inbox.ts';
import type { UserModel } from './user-model.ts';

/** Sections loaded at once: each holds a few chunks in flight, so the user's memory stays bounded however many workers there are. */
export const LOAD_CONCURRENCY = 4;
/**
 * A worker lost this recently is not planned onto again: a validator lists a worker until its
 * announcements stop for 10 s, so a dead one is still listed for a while. A worker that comes
 * back (restarted with its identity) is used again after this.
 */
export const LOST_AVOID_MS = 20_000;
/**
 * A job asks whether a better plan exists (a worker joined, a link changed) at most this often,
 * between sessions or at a training job's copies: each survey probes the candidates' links, and
 * moving a job reloads its sections, so it is not worth doing for every token or step.
 */
export const REPLAN_CHECK_MS = 60_000;

/**
 * A better plan over a swarm in which no worker came or went and no link changed by 2× is taken
 * only when it predicts a step at least this much faster: measured again on a busy machine, the
 * same links read 20–40% differently, and each move reloads every section.
 */
export const UNCHANGED_GAIN = 0.5;

/** What a survey of the swarm proposes (see proposeReplan). */
export interface ReplanProposal {
  reason: string;
  /** Predicted seconds a step: the running plan under today's links, and the proposal. */
  current: number;
  proposed: number;
  /** A worker joined or left, or a link changed, since the plan was made. */
  changed: boolean;
}

/** A job planned again because the swarm changed, and why. */
export interface ReplanEvent {
  at: number;
  /** What changed and the predicted step times before and after. */
  reason: string;
  /** The training step it moved at (none for generation). */
  step?: number;
}

export interface DistributedTrainerOptions {
  /** AdamW on every holder of parameters (the only optimizer so far). */
  optimizer: { name?: 'adamw'; lr: number; weightDecay?: number };
  /** Steps the learning-rate schedule spans (warm-up, then cosine to 10%). */
  totalSteps: number;
  warmupSteps?: number;
  /** Micro-batches per step (default: one per replica). */
  microBatches?: number;
  schedule?: ScheduleName;
  /** Must equal the replicas the model was distributed with, if given. */
  replicas?: number;
  /** Clip the global gradient norm over all stages (default 1; 0 disables). */
  clipNorm?: number;
  /** Workers recompute activations in the backward instead of keeping them. */
  recompute?: boolean;
  /**
   * Steps between copies of the job's state (weights and moments of every section) kept in the
   * user's memory, from which a job that loses a worker is rebuilt. Default: a copy every
   * SNAPSHOT_INTERVAL_MS of training when it fits in SNAPSHOT_MAX_BYTES, else none (a failover
   * then replays from the job's start, whose weights the user's source holds).
   */
  snapshotEvery?: number;
  /** false: a lost worker fails the step (StageFailedError) instead of being replaced. */
  failover?: boolean;
  /**
   * true: every activation and gradient goes worker → user → worker, as before #17 (2 transfers
   * per hop). Default false: they go worker to worker and only the ends touch the user.
   */
  relay?: boolean;
  /** How activations and their gradients travel on every hop: float16, or int8 with a scale per row (default: float32). */
  compressActivations?: 'fp16' | 'int8';
  /**
   * Replicas exchange their gradients DCT top-k compressed with error feedback (Templar, DeMo):
   * k coefficients kept per chunk × chunk block, values at `bits` (default: dense float32, exact).
   */
  compressGrads?: DctTopkOptions;
  /**
   * Local steps (DiLoCo; Templar's SparseLoCo): each replica steps on its own micro-batches and
   * the replicas average how far their weights moved every this many steps (and at the last
   * step of the schedule), through `compressGrads` when given. Default 1: gradients are summed
   * every step, the same as one process.
   */
  syncEvery?: number;
}

/**
 * Time between copies of a training job's state, by default: a failover replays at most about
 * this much training, and a copy (a request per weight and per moment) costs a small share of it.
 */
export const SNAPSHOT_INTERVAL_MS = 30_000;
/**
 * Largest copy of a job's state (weights and two moments of every section) kept by default:
 * a user that holds only the ends of a model far larger than its memory has no room for a copy
 * of the rest, so a larger job replays from its start instead (set snapshotEvery to insist).
 */
export const SNAPSHOT_MAX_BYTES = 256 * 1024 ** 2;

/** A copy of a training job's state at the end of a step: what a failover rebuilds the job from. */
interface Snapshot {
  step: number;
  /** Every section's weights, by checkpoint name. */
  weights: Map<string, Tensor>;
  /** AdamW's state of every parameter that has taken a step (the user's ends too). */
  optimizer: Map<string, { moments: Tensor; step: number }>;
  /** The user's end parameters, in layerParameters order. */
  ends: Float32Array[];
}

/** A model split across workers; the user holds its ends. */
export interface DistributedModel {
  /** The job's id on the workers (a job planned again after a worker was caught runs under a new one): its records and escrow name it. */
  readonly jobId: string;
  readonly plan: Plan;
  /** Which worker runs which layers (global layer indices, end exclusive), for each replica. */
  readonly assignment: { peerId: string; start: number; end: number; replica: number }[];
  generate(prompt: number[], options?: GenerateOptions): Promise<{ tokens: number[] }>;
  generateBatch(prompts: number[][], options?: GenerateOptions): Promise<{ tokens: number[][] }>;
  /** The logits [B, T, V] of token ids [B, T] (int32), computed across the workers in a session of its own. */
  logits(ids: Tensor): Promise<Tensor>;
  /** Sets up training on the workers (their AdamW, the reductions among replicas, verification) and returns the trainer. */
  trainer(options: DistributedTrainerOptions): Promise<JobTrainer>;
  /** AdamW's state of every parameter that has taken a step, from its first holder: for checkpoints. */
  optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>>;
  /** Gives every holder (replicas too) its parameters' optimizer state: resuming from a checkpoint. */
  setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void>;
  /** Brings the workers' weights into the user's model (to run it alone) and returns it: only when the user holds the whole model. */
  pull(): Promise<CausalLM>;
  /** Writes the model as it is now to a Hugging Face directory, weight by weight as they arrive from the workers. */
  save(dir: string, options?: { maxShardBytes?: number }): Promise<string[]>;
  /** What verification has done in this job so far: records re-run, failures, workers caught, steps replayed. */
  readonly verification: VerificationSummary | null;
  /** Workers lost while the job ran (dead, cut off, or past their deadline) and how the job went on without them. */
  readonly failovers: readonly FailoverEvent[];
  /** Times the job moved to a better plan because the swarm changed, with the reason. */
  readonly replans: readonly ReplanEvent[];
  /** Waits for the checks still under way (the last training step's re-runs, a rollback they call for); the summary then. */
  settle(): Promise<VerificationSummary | null>;
  /** Ends the job: every worker frees its section, caches and training state. */
  close(): Promise<void>;
}

/** Where a job's sections are: its id on the workers, its plan and its opened stages. */
export interface Placement {
  jobId: string;
  plan: Plan;
  sections: JobStage[][];
}

/** One section of the job on one worker, as the user drives it. */
export interface JobStage {
  where: StageAssignment;
  remote: RemoteStage;
}

/**
 * A job distributed over workers: sections[i][r] is replica r of the i-th section. Generation
 * runs on replica 0 of each section, chained worker to worker (or relayed by the user); the
 * user's ends run on its own model. A section's worker can be replaced (`replaceStage`): the
 * new worker loads the section, every worker of the job learns the new assignment, and the
 * next generation step takes the new route.
 */
export class DistributedJob implements DistributedModel {
  private pipeline: PipelineTrainer | null = null;
  private readonly keepEnds: boolean;

  private readonly onProgress: ((stage: JobStage, progress: LoadProgress) => void) | undefined;
  /** Checks the workers' records: sampled re-execution, redundant copies compared. */
  readonly verifier: JobVerifier | null;
  /** Plans and opens the job again on the workers still trusted and not in `avoid` (a rollback, a failover). */
  private readonly relocate: ((avoid?: ReadonlySet<string>) => Promise<Placement>) | null;
  /** Where to ask for live workers (spares for a failover); null: the job cannot fail over to a spare. */
  private readonly validator: Parameters<typeof listWorkers>[1] | null;
  /** Tokens per step the plan was made for: its predicted seconds scale from there. */
  private readonly planTokens: number;
  /** Workers lost in this job and when: a re-plan soon after avoids them (the validator lists a dead worker for a while). */
  private readonly lost = new Map<string, { at: number; target: PeerTarget; late: boolean }>();
  readonly failovers: FailoverEvent[] = [];
  /** Failovers whose first result after recovery has not come yet. */
  private recovering: FailoverEvent[] = [];
  /** Proposes a better plan under the swarm as it is now (null: keep this one); null when the job cannot ask. */
  private readonly propose: ((current: Plan, avoid: ReadonlySet<string>) => Promise<ReplanProposal | null>) | null;
  readonly replans: ReplanEvent[] = [];
  private lastReplanCheck = Date.now();

  constructor(
    private readonly node: Libp2p,
    public jobId: string,
    /** What the user holds of the model: its ends (or the whole model) and where sections come from. */
    readonly source: UserModel,
    public plan: Plan,
    /** sections[i][c]: copy c of the i-th section (a replica for data parallelism, or a redundant copy). */
    private sections: JobStage[][],
    /** Where chained results arrive; null: the user relays hidden states between workers. */
    private readonly inbox: ResultInbox | null,
    options: {
      keepEnds: boolean;
      onProgress?: (stage: JobStage, progress: LoadProgress) => void;
      verifier?: JobVerifier | null;
      relocate?: (avoid?: ReadonlySet<string>) => Promise<Placement>;
      validator?: Parameters<typeof listWorkers>[1];
      tokens?: number;
      propose?: (current: Plan, avoid: ReadonlySet<string>) => Promise<ReplanProposal | null>;
      /** The model's name on the validator's dashboard. */
      name?: string;
    },
  ) {
    this.keepEnds = options.keepEnds;
    this.onProgress = options.onProgress;
    this.verifier = options.verifier ?? null;
    this.relocate = options.relocate ?? null;
    this.validator = options.validator ?? null;
    this.planTokens = options.tokens ?? 1;
    this.propose = options.propose ?? null;
    const shown = () => ({ jobId: this.jobId, stages: this.stagesShown() });
    this.progress = this.validator ? new ProgressReporter(node, this.validator, shown, options.name) : null;
  }

  /** Reports the job's progress to the validator's dashboard (null: no validator to tell). */
  private readonly progress: ProgressReporter | null;

  /** The plan as the dashboard shows it: each section's layers and the workers holding its copies. */
  private stagesShown(): { start: number; end: number; peers: string[] }[] {
    return this.sections.map((copies) => ({
      start: copies[0].where.start, end: copies[0].where.end, peers: copies.map((c) => c.where.peerId),
    }));
  }

  /** A generation call answered: its tokens go on the dashboard (a training job reports its steps instead). */
  private async reported<T>(run: () => Promise<T>, tokens: (result: T) => number): Promise<T> {
    const started = performance.now();
    const result = await run();
    if (!this.jobTrainer) this.progress?.generated(tokens(result), (performance.now() - started) / 1000);
    return result;
  }

  /**
   * Whether the job should move to a better plan now (at most every REPLAN_CHECK_MS): the reason
   * when the swarm changed enough (see proposeReplan), else null. A survey that fails keeps the plan.
   */
  private async betterPlan(): Promise<string | null> {
    if (!this.propose || !this.relocate || Date.now() - this.lastReplanCheck < REPLAN_CHECK_MS) return null;
    if (this.pulled && this.source.whole) return null;
    this.lastReplanCheck = Date.now();
    try {
      const p = await this.propose(this.plan, await this.recentlyLost());
      // the same swarm measured again reads differently on a loaded machine: a move needs a change, or a large gain
      if (!p || (!p.changed && p.proposed > (1 - UNCHANGED_GAIN) * p.current)) return null;
      return p.reason;
    } catch {
      return null;
    }
  }

  /** The trainer handed out, once trainer() ran: its last step's checks are settled before anything is read back. */
  private jobTrainer: JobTrainer | null = null;

  /** Set once pull() wrote the workers' weights into the in-memory model the sections were loaded from. */
  private pulled = false;

  /** The last copy of the training job's state (null: none yet, or one a rollback made stale). */
  private snapshot: Snapshot | null = null;
  /** While set, sections load from these weights (a copy) instead of the user's source. */
  private loadFrom: Map<string, Tensor> | null = null;

  /** The optimizer every holder runs (re-execution runs the same), once trainer() ran. */
  optimizerSettings: { lr: number; weightDecay?: number } | null = null;

  /**
   * Bytes the job moved so far, by kind: what this user sent to its workers and what each worker
   * reported sending at its last step (hops, gradients among replicas, weights, control).
   * Workers the job left (failover) are no longer counted.
   */
  traffic(): Traffic {
    const total = newTraffic();
    for (const s of this.sections.flat()) addTraffic(total, s.remote.traffic);
    for (const st of this.pipeline?.stages ?? []) {
      for (const h of st.replicas) if (h instanceof RedundantStage) for (const lane of h.lanes) addTraffic(total, lane.workerTraffic);
    }
    return total;
  }

  /** What verification has done in this job so far. */
  get verification(): VerificationSummary | null {
    return this.verifier ? { ...this.verifier.summary, flagged: [...this.verifier.summary.flagged] } : null;
  }

  /** The user's own layers (its ends); a typed error when it keeps none. */
  private get ends(): CausalLM {
    if (!this.source.ends) throw new InvalidArgumentError('this job keeps no layers on the user\'s side (privacy \'none\')');
    return this.source.ends;
  }

  get assignment(): { peerId: string; start: number; end: number; replica: number }[] {
    return this.sections.flat().map(({ where }) => ({ peerId: where.peerId, start: where.start, end: where.end, replica: where.replica }));
  }

  /** Every section of the job with its worker's addresses: what each worker is told. */
  private fullAssignment(): StageAssignment[] {
    return this.sections.flat().map((s) => s.where);
  }

  /** The chain of generation: replica 0 of every section, in order. */
  route(): JobStage[] {
    return this.sections.map((copies) => copies[0]);
  }

  /**
   * Loads every section on its worker, LOAD_CONCURRENCY at a time: each streams from the
   * user's source while the others do, so the user holds only the chunks in flight.
   */
  async load(): Promise<LoadResult[]> {
    const assignment = this.fullAssignment();
    const stages = this.sections.flatMap((copies, i) => copies.map((s) => ({ i, s })));
    const results: LoadResult[] = new Array(stages.length);
    // one failed section stops the others: the job fails as a whole
    const failed = new AbortController();
    let next = 0;
    const lane = async () => {
      while (next < stages.length && !failed.signal.aborted) {
        const k = next++;
        try {
          results[k] = await this.loadStage(stages[k].i, stages[k].s, assignment, failed.signal);
        } catch (err) {
          failed.abort();
          throw err;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(LOAD_CONCURRENCY, stages.length) }, lane));
    return results;
  }

  private async loadStage(section: number, s: JobStage, assignment: StageAssignment[], signal?: AbortSignal): Promise<LoadResult> {
    const range: [number, number] = [s.where.start, s.where.end];
    const onProgress = this.onProgress ? (p: LoadProgress) => this.onProgress!(s, p) : undefined;
    const verifiers = this.verifier ? [this.verifier.validatorPeer] : [];
    const options = { upstream: this.upstreamOf(section, s), assignment, onProgress, signal, verifiers };
    let source = this.source.section(range);
    const copy = this.loadFrom;
    if (copy) source = tensorSource(new Map(source.weights.map((w) => [w.name, copy.get(w.name)!])));
    return s.remote.load(configToHF(this.source.config), range, source, options);
  }

  /** The peer that passes activations to this stage: the previous section's first replica, in a chain. */
  private upstreamOf(section: number, s: JobStage): string | undefined {
    return this.inbox && section > 0 && s.where.replica === 0 ? this.sections[section - 1][0].where.peerId : undefined;
  }

  /**
   * Moves replica `replica` of section `section` to another worker: opens the job there, loads
   * the section (content-addressed: only chunks it lacks move), tells every worker of the job
   * the new assignment, and closes the old stage. Generation continues on the new route.
   */
  async replaceStage(section: number, replica: number, worker: PeerTarget): Promise<void> {
    if (this.pipeline) throw new InvalidArgumentError('the stages of a job that trains cannot be replaced yet: the trainer holds them');
    const old = this.sections[section]?.[replica];
    if (!old) throw new InvalidArgumentError(`the job has no replica ${replica} of section ${section}`);
    // a worker holds one section of a job (jobs are keyed by id): loading a second would replace the first
    if (this.sections.flat().some((s) => s.where.peerId === worker.peerId)) {
      throw new InvalidArgumentError(`${worker.peerId} already holds a section of this job; move the stage to a worker outside it`);
    }
    const remote = await RemoteStage.open(this.node, worker, this.jobId);
    const fresh: JobStage = { where: { ...old.where, peerId: worker.peerId, addrs: worker.addrs }, remote };
    const assignment = this.fullAssignment().map((w) => (w === old.where ? fresh.where : w));
    try {
      await this.loadStage(section, fresh, assignment);
    } catch (err) {
      await remote.close();
      throw err;
    }
    this.sections[section][replica] = fresh;
    if (old.remote.open) await old.remote.close();
    await Promise.all(
      this.sections.flatMap((copies, i) =>
        copies.filter((s) => s !== fresh).map((s) => {
          const upstream = this.upstreamOf(i, s);
          return s.remote.call({ type: 'assign', assignment, ...(upstream ? { upstream } : {}) }, []);
        })),
    );
  }

  /**
   * Workers lost in the last LOST_AVOID_MS that still do not answer: a re-plan does not choose
   * them (the validator lists a dead worker until its announcements lapse). One that answers
   * again (restarted with its identity) may be chosen at once.
   */
  private async recentlyLost(): Promise<Set<string>> {
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
   * workers). The caller then rebuilds what the step left (a session replays its steps). A typed
   * StageFailedError, naming the section and the cause, when no live worker can take it.
   */
  async recover(
    cause: unknown,
    attempt: number,
    options: {
      during?: FailoverEvent['during'];
      /** How the job is planned again without the lost workers (default: replan, sections from the user's source). */
      rebuild?: (avoid: ReadonlySet<string>) => Promise<void>;
      /** Where the session stood (generation): a late chained step is blamed on the first stage behind. */
      progress?: SessionProgress;
    } = {},
  ): Promise<void> {
    const during = options.during ?? 'generation';
    const rebuild = options.rebuild ?? ((avoid) => this.replan(avoid));
    if (!isLoss(cause)) throw cause;
    if (during === 'generation' && this.pipeline && this.jobTrainer) {
      // the workers hold trained weights the user's source does not: the trainer rebuilds the job from its copy
      await this.jobTrainer.heal(cause);
      return;
    }
    const detectedAt = Date.now();
    const lost = await findLost(this.node, this.sections.flat(), this.jobId, cause, options.progress);
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
    const spare = lost.length === 1 && during === 'generation' && !this.pipeline ? await this.moveToSpare(lost[0]) : null;
    if (spare) events[0].replacement = [spare];
    else {
      if (!this.relocate) throw sectionLost(lost[0], cause, 'this job cannot be planned again');
      // the survivors' sampled records belong to the job being closed: they can no longer be re-run
      this.verifier?.discardSampled();
      try {
        await rebuild(await this.recentlyLost());
      } catch (err) {
        throw sectionLost(lost[0], cause, `no live worker could take them: ${(err as Error).message}`);
      }
      for (const e of events) {
        e.action = 'replanned';
        e.replacement = this.assignment.filter((a) => a.start < e.layers[1] && a.end > e.layers[0]).map((a) => a.peerId);
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
    const members = new Set(this.sections.flat().map((s) => s.where.peerId));
    const spares = (await listWorkers(this.node, this.validator).catch(() => []))
      .filter((w) => !members.has(w.peerId) && !avoid.has(w.peerId) && !this.verifier?.excluded.has(w.peerId));
    const section = this.sections.findIndex((copies) => copies.includes(stage));
    const replica = this.sections[section].indexOf(stage);
    for (const w of spares) {
      try {
        await this.replaceStage(section, replica, { peerId: w.peerId, addrs: w.addrs });
        return w.peerId;
      } catch {
        // it could not take the section (memory, gone meanwhile): the next one may
      }
    }
    return null;
  }

  /** Runs the user's first end (the embedding) or its last (final norm and head): the first layer it holds, or the last two. */
  private runEnd(which: 'first' | 'last', x: Tensor, positions: Tensor): Tensor {
    const layers = this.ends.layers;
    const run = which === 'first' ? layers.slice(0, 1) : layers.slice(layers.length - 2);
    return noGrad(() => runLayers(run, x, { positions }, this.source.config.maxPositions));
  }

  /** A new session's steps on the job's workers as they are (and as failovers leave them). */
  private newSession(): SessionSteps {
    return new SessionSteps({
      jobId: () => this.jobId,
      sections: () => this.sections,
      inbox: this.inbox,
      verifier: this.verifier,
      exclude: (s) => this.excludeStage(s),
      deadlineMs: (tokens) => deadlineMs(predictedSeconds(this.plan, tokens, this.planTokens)),
      recover: (cause, attempt, progress) => this.recover(cause, attempt, { progress }),
      recovered: (replayed) => this.recovered(replayed),
    }, randomUUID());
  }

  /** One step of a session through the job: the user's first end, the workers (every result checked), the user's last end. */
  private stepModel(steps: SessionSteps): StepModel {
    const config = this.source.config;
    return {
      maxPositions: config.maxPositions,
      eosTokenId: this.source.tokenizer?.eosTokenId ?? config.eosTokenId ?? null,
      step: async (ids, opts) => {
        const positions = opts.positions!;
        const keyMask = opts.keyMask ?? null;
        const x = await steps.run(this.keepEnds ? this.runEnd('first', ids, positions) : ids, positions, keyMask);
        return this.keepEnds ? this.runEnd('last', x, positions) : x;
      },
    };
  }

  /**
   * Runs a session and has its sampled records re-run before it closes (the workers keep a
   * session's inputs until then). When a worker is caught, its results may have steered the
   * session: the job is planned again on trusted workers and the session run again.
   */
  private async session<T>(run: (session: SessionSteps) => Promise<T>, steps: (result: T) => number): Promise<T> {
    await this.settle();
    // between sessions the job may move to a better plan: nothing is lost, the sections load where they go
    const reason = this.pipeline ? null : await this.betterPlan();
    if (reason) {
      this.verifier?.discardSampled();
      await this.replan(await this.recentlyLost());
      this.replans.push({ at: Date.now(), reason });
    }
    for (;;) {
      const session = this.newSession();
      let result: T;
      let failed: { peer: string }[];
      try {
        result = await run(session);
        failed = (await this.verifier?.auditSampled()) ?? [];
      } catch (err) {
        // a session that failed leaves nothing to re-run: its workers drop it as it closes
        this.verifier?.discardSampled();
        throw err;
      } finally {
        // every id the session had on the workers (a failover starts a new one on the new route)
        await Promise.all(this.sections.flat().flatMap((s) => session.sessionIds.map((id) => s.remote.closeSession(id).catch(() => {}))));
      }
      if (failed.length === 0) return result;
      if (this.pipeline || !this.relocate) {
        throw new VerificationError(`${failed.map((f) => f.peer).join(', ')} failed re-execution of a decoding step; the result was discarded`, {
          details: { flagged: failed.map((f) => f.peer) },
        });
      }
      await this.replan();
      this.verifier!.summary.replayedSteps += steps(result);
    }
  }

  /** Closes every section and places the job again on the workers the validator still trusts. */
  private async replan(avoid?: ReadonlySet<string>): Promise<void> {
    if (this.pulled && this.source.whole) {
      throw new VerificationError('this job cannot be planned again: pull() wrote the workers\' weights into the model it was distributed from');
    }
    await Promise.all(this.sections.flat().map((s) => (s.remote.open ? s.remote.close() : undefined)));
    const placed = await this.relocate!(avoid);
    this.jobId = placed.jobId;
    this.plan = placed.plan;
    this.sections = placed.sections;
    this.pipeline = null;
    try {
      await this.load();
    } catch (err) {
      await Promise.all(this.sections.flat().map((s) => s.remote.close()));
      throw err;
    }
  }

  async generate(prompt: number[], options: GenerateOptions = {}): Promise<{ tokens: number[] }> {
    const rows = await this.reported(
      () => this.session((s) => generateWith(this.stepModel(s), [prompt], options), (t) => t[0].length),
      (t) => t[0].length,
    );
    return { tokens: rows[0] };
  }

  async generateBatch(prompts: number[][], options: GenerateOptions = {}): Promise<{ tokens: number[][] }> {
    const rows = await this.reported(
      () => this.session((s) => generateWith(this.stepModel(s), prompts, options), (t) => t[0]?.length ?? 0),
      (t) => t.reduce((sum, row) => sum + row.length, 0),
    );
    return { tokens: rows };
  }

  async logits(ids: Tensor): Promise<Tensor> {
    if (ids.dtype !== 'int32' || ids.ndim !== 2) throw new InvalidArgumentError(`logits takes int32 ids [batch, time], got ${ids.dtype} [${ids.shape}]`);
    const positions = defaultPositions(ids.shape[0], ids.shape[1], 0);
    return this.session(async (s) => this.stepModel(s).step(ids, { positions, keyMask: null }), () => 1);
  }

  /** Copies of each section that train different micro-batches: 1 when the copies are redundant. */
  private get replicas(): number {
    return (this.verifier?.redundancy ?? 1) > 1 ? 1 : this.sections[0].length;
  }

  async trainer(o: DistributedTrainerOptions): Promise<JobTrainer> {
    const replicas = this.replicas;
    if (o.replicas !== undefined && o.replicas !== replicas) {
      throw new InvalidArgumentError(`the model was distributed with ${replicas} replica(s), the trainer asks for ${o.replicas}: pass replicas to distribute()`);
    }
    if (this.pipeline) throw new InvalidArgumentError('this distributed model already has a trainer');
    const verifier = this.verifier;
    if (!verifier) throw new InvalidArgumentError('this job was made without a verifier: distribute() makes one');
    const { lr, weightDecay } = o.optimizer;
    this.optimizerSettings = { lr, ...(weightDecay === undefined ? {} : { weightDecay }) };
    // the user's ends as they start: a rollback restores them
    const start = this.keepEnds ? [...layerParameters(this.endLayers()).values()].map((t) => (t.data as Float32Array).slice()) : [];
    const restart = async () => {
      // a worker caught may have steered every step: copies of the state are no longer trusted
      this.snapshot = null;
      await this.replan();
      if (this.keepEnds) [...layerParameters(this.endLayers()).values()].forEach((t, i) => (t.data as Float32Array).set(start[i]));
      return this.buildPipeline(o, verifier);
    };
    const pipeline = await this.buildPipeline(o, verifier);
    this.jobTrainer = new JobTrainer(pipeline, verifier, async () => {
      if (!this.relocate) throw new VerificationError('a worker was caught and this job cannot be planned again');
      return restart();
    }, o.failover === false ? null : this.trainingFailover(o, verifier, start));
    const progress = this.progress;
    if (progress) this.jobTrainer.onStep = (r, tokens) => progress.trained(this.jobTrainer!.stepCount, r.loss, tokens, r.seconds, r.busy);
    return this.jobTrainer;
  }

  /** How this job survives a lost worker while it trains: copies of its state, and a rebuild from the last one. */
  private trainingFailover(o: DistributedTrainerOptions, verifier: JobVerifier, start: Float32Array[]): TrainingFailover {
    // the copy: every section's weights and their two moments
    const weights = this.sections.flatMap(([s]) => this.source.section([s.where.start, s.where.end]).weights);
    const bytes = 3 * 4 * weights.reduce((sum, w) => sum + w.shape.reduce((a, b) => a * b, 1), 0);
    const fits = bytes <= SNAPSHOT_MAX_BYTES;
    return {
      every: o.snapshotEvery ?? 0,
      intervalMs: o.snapshotEvery === undefined && fits ? SNAPSHOT_INTERVAL_MS : 0,
      take: async (step) => {
        this.snapshot = await this.takeSnapshot(step);
      },
      propose: () => this.betterPlan(),
      move: async (step, reason) => {
        // rebuilt from the copy just taken: nothing is replayed
        const pipeline = await this.rebuildFromSnapshot(o, verifier, start, await this.recentlyLost());
        this.replans.push({ at: Date.now(), reason, step });
        return pipeline;
      },
      rebuild: async (cause, attempt) => {
        let pipeline: PipelineTrainer | null = null;
        await this.recover(cause, attempt, {
          during: 'training',
          rebuild: async (avoid) => {
            pipeline = await this.rebuildFromSnapshot(o, verifier, start, avoid);
          },
        });
        return { pipeline: pipeline!, from: this.snapshot?.step ?? 0 };
      },
      recovered: (replayed) => this.recovered(replayed),
    };
  }

  /**
   * Plans the job again (without `avoid`), loads its sections from the last copy of its state (or
   * the user's source, when there is none: the job's start), restores the user's ends and every
   * holder's moments, and returns a pipeline at the copy's step.
   */
  private async rebuildFromSnapshot(
    o: DistributedTrainerOptions,
    verifier: JobVerifier,
    start: Float32Array[],
    avoid: ReadonlySet<string>,
  ): Promise<PipelineTrainer> {
    const snap = this.snapshot;
    this.loadFrom = snap?.weights ?? null;
    try {
      await this.replan(avoid);
    } finally {
      this.loadFrom = null;
    }
    const ends = snap?.ends ?? start;
    if (this.keepEnds) {
      // a step that failed in its flush left gradients on the user's ends: the replay starts without them
      [...layerParameters(this.endLayers()).values()].forEach((t, i) => {
        (t.data as Float32Array).set(ends[i]);
        t.grad = null;
      });
    }
    const pipeline = await this.buildPipeline(o, verifier);
    if (snap) {
      await Promise.all(pipeline.stages.flatMap((st) => st.replicas).map((h) => h.setOptimizerState(snap.optimizer)));
      pipeline.fastForward(snap.step);
    }
    return pipeline;
  }

  /** Copies every section's weights (from its first holder) and every holder's optimizer state, and the user's ends. */
  private async takeSnapshot(step: number): Promise<Snapshot> {
    const weights = new Map<string, Tensor>();
    // each section from its own worker at once (one stream each), weight by weight
    await Promise.all(this.sections.map(async ([{ remote, where }]) => {
      for (const w of this.source.section([where.start, where.end]).weights) weights.set(w.name, await remote.weight(w.name));
    }));
    const optimizer = new Map<string, { moments: Tensor; step: number }>();
    const states = await Promise.all(this.pipeline!.stages.flatMap((st) => st.replicas).map((h) => h.optimizerState()));
    for (const state of states) {
      // copied: the user's own ends hand out the moments they go on updating
      for (const [n, st] of state) {
        const moments = tensor((st.moments.data as Float32Array).slice(), st.moments.shape);
        if (!optimizer.has(n)) optimizer.set(n, { moments, step: st.step });
      }
    }
    const ends = this.keepEnds ? [...layerParameters(this.endLayers()).values()].map((t) => (t.data as Float32Array).slice()) : [];
    return { step, weights, optimizer, ends };
  }

  /** Settles the checks still under way (the last training step's re-runs): anything read from the workers after this is verified. */
  async settle(): Promise<VerificationSummary | null> {
    await this.jobTrainer?.settle();
    await this.verifier?.drain();
    return this.verification;
  }

  /** The user's own layers: the embedding, and the final norm with the head. */
  private endLayers() {
    const layers = this.ends.layers;
    return [layers[0], ...layers.slice(layers.length - 2)];
  }

  /** A worker caught cheating leaves the job: its stage is closed and it is no longer a copy of its section. */
  private async exclude(lane: RemoteTrainStage): Promise<void> {
    const stage = this.sections.flat().find((s) => s.remote === lane.stage);
    if (stage) await this.excludeStage(stage);
  }

  private async excludeStage(stage: JobStage): Promise<void> {
    for (const copies of this.sections) {
      const i = copies.indexOf(stage);
      if (i >= 0) copies.splice(i, 1);
    }
    await stage.remote.close();
  }

  private async buildPipeline(o: DistributedTrainerOptions, verifier: JobVerifier): Promise<PipelineTrainer> {
    const replicas = this.replicas;
    const executor = { lr: o.optimizer.lr, weightDecay: o.optimizer.weightDecay, recompute: o.recompute };
    // the job's other holders may send gradients (the validator, named at load, may fetch what re-running a record needs)
    const peers = this.assignment.map((a) => a.peerId);
    // a forward or backward may take DEADLINE_SLACK times the plan's prediction (a backward costs about twice a forward)
    const deadline = (i: number) => (tokens: number) => deadlineMs((3 * (this.plan.stages[i]?.seconds ?? 0) * tokens) / this.planTokens);
    const handles = this.sections.map((copies, i) =>
      copies.map((s) => new RemoteTrainStage(s.remote, s.where, `worker ${s.where.peerId}, layers ${s.where.start}–${s.where.end - 1}`, deadline(i))));
    const compressGrads = o.compressGrads ? { compressGrads: checkDctTopk(o.compressGrads) } : {};
    // local steps average replicas: with none, the job's steps are those of one process
    const sync = (o.syncEvery ?? 1) > 1 && replicas > 1 ? { syncEvery: o.syncEvery } : {};
    const keepState = verifier.keepsState;
    await Promise.all(handles.flat().map((h) => h.setup({ ...executor, keepState, peers, ...compressGrads, ...sync })));
    for (const h of handles.flat()) {
      if (!o.relay) h.direct = h.peerId;
      h.codec = o.compressActivations ?? null;
    }
    const onFlag = (lane: RemoteTrainStage) => this.exclude(lane);
    // redundant copies run the same micro-batches as one stage; replicas run their own
    const middle: PipelineStage[] = handles.map((hs) => ({
      replicas: replicas === 1 ? [new RedundantStage(hs, verifier, onFlag)] : hs.map((h) => new RedundantStage([h], verifier, onFlag)),
    }));
    const ends = this.keepEnds ? userEnds(this.ends, executor) : null;
    this.pipeline = new PipelineTrainer(ends ? [ends.first, ...middle, ends.last] : middle, {
      lr: o.optimizer.lr,
      totalSteps: o.totalSteps,
      warmupSteps: o.warmupSteps,
      clipNorm: o.clipNorm,
      microBatches: o.microBatches ?? replicas,
      schedule: o.schedule,
      ...sync,
    });
    return this.pipeline;
  }

  async optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>> {
    if (!this.pipeline) throw new InvalidArgumentError('this distributed model has no trainer yet: call trainer() first');
    await this.settle();
    const out = new Map<string, { moments: Tensor; step: number }>();
    for (const h of this.pipeline.stages.flatMap((s) => s.replicas)) {
      for (const [n, s] of await h.optimizerState()) if (!out.has(n)) out.set(n, s);
    }
    return out;
  }

  /**
   * AdamW's state parameter by parameter, for checkpoints of models larger than the user's
   * memory: each parameter that has taken a step, its shape and step count, and a fetch of its
   * moments ([2, ...shape]) from its first holder when the writer gets to it.
   */
  async optimizerEntries(): Promise<{ name: string; shape: number[]; step: number; moments: () => Promise<Tensor> }[]> {
    if (!this.pipeline) throw new InvalidArgumentError('this distributed model has no trainer yet: call trainer() first');
    await this.settle();
    const out: { name: string; shape: number[]; step: number; moments: () => Promise<Tensor> }[] = [];
    const seen = new Set<string>();
    const shapes = new Map<string, number[]>();
    for (const [s] of this.sections) for (const w of this.source.section([s.where.start, s.where.end]).weights) shapes.set(w.name, w.shape);
    for (const stage of this.pipeline.stages) {
      const first = stage.replicas[0];
      const h = first instanceof RedundantStage ? first.primary : first;
      if (h instanceof RemoteTrainStage) {
        for (const { name, step } of await h.momentSteps()) {
          if (seen.has(name)) continue;
          seen.add(name);
          out.push({ name, shape: shapes.get(name)!, step, moments: () => h.moments(name) });
        }
      } else {
        // the user's own ends: small, and in this process
        for (const [name, s] of await h.optimizerState()) {
          if (seen.has(name)) continue;
          seen.add(name);
          out.push({ name, shape: s.moments.shape.slice(1), step: s.step, moments: async () => s.moments });
        }
      }
    }
    return out;
  }

  /** Restores AdamW's state parameter by parameter (`read` gives its moments and step, or null): resuming without holding it all. */
  async restoreOptimizer(read: (name: string) => { moments: Tensor; step: number } | null): Promise<void> {
    if (!this.pipeline) throw new InvalidArgumentError('this distributed model has no trainer yet: call trainer() first');
    for (const h of this.pipeline.stages.flatMap((s) => s.replicas)) {
      for (const name of h.names) {
        const s = read(name);
        if (s) await h.setOptimizerState(new Map([[name, s]]));
      }
    }
  }

  async setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void> {
    if (!this.pipeline) throw new InvalidArgumentError('this distributed model has no trainer yet: call trainer() first');
    await Promise.all(this.pipeline.stages.flatMap((s) => s.replicas).map((h) => h.setOptimizerState(state)));
  }

  async pull(): Promise<CausalLM> {
    const model = this.source.whole;
    if (!model) throw new InvalidArgumentError('the user holds only the ends of this model: write its weights with save(dir) instead of pulling them into memory');
    await this.settle();
    // the model the job was distributed from now holds trained weights: a rollback can no longer reload its start from it
    this.pulled = true;
    for (const copies of this.sections) {
      const { remote, where } = copies[0];
      for (const w of this.source.section([where.start, where.end]).weights) {
        model.loadStateDict(new Map([[w.name, await remote.weight(w.name)]]), { strict: false });
      }
    }
    return model;
  }

  /**
   * Writes the model as it is now (the user's ends and every worker's section) to `dir` in
   * Hugging Face's layout, sharded above `maxShardBytes`: each weight is fetched from its first
   * holder and written as it arrives, so the user never holds more than one weight.
   */
  async save(dir: string, options: { maxShardBytes?: number } = {}): Promise<string[]> {
    await this.settle();
    const from = new Map<string, () => Promise<Tensor>>();
    const planned: { name: string; shape: number[] }[] = [];
    const add = (name: string, shape: readonly number[], get: () => Promise<Tensor>) => {
      if (from.has(name)) return; // a tied table held at both ends is written once
      from.set(name, get);
      planned.push({ name, shape: [...shape] });
    };
    if (this.keepEnds) {
      // the user's own layers only (a whole model in memory has stale copies of the workers' sections)
      const layers = this.ends.layers;
      for (const [name, t] of layerParameters([layers[0], ...layers.slice(layers.length - 2)])) add(name, t.shape, async () => t);
    }
    for (const copies of this.sections) {
      const { remote, where } = copies[0];
      for (const w of this.source.section([where.start, where.end]).weights) add(w.name, w.shape, () => remote.weight(w.name));
    }
    return saveModelStreamed(dir, this.source.config, this.source.tokenizer, planned, (name) => from.get(name)!(), options);
  }

  async close(): Promise<void> {
    await this.progress?.closed();
    await this.verifier?.drain();
    await Promise.all(this.sections.flat().map((s) => s.remote.close()));
    this.source.close();
  }
}
