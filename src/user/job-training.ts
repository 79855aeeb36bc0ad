import { checkDctTopk, type DctTopkOptions } from '../compress/index.ts';
import { InvalidArgumentError, StageFailedError, VerificationError } from '../errors.ts';
import { layerParameters } from '../models/index.ts';
import { addTraffic, type Traffic } from '../p2p/index.ts';
import { type PipelineStage, PipelineTrainer, type ScheduleName, type StageHandle, userEnds } from '../pipeline/index.ts';
import { type Tensor, tensor } from '../tensor/index.ts';
import { deadlineMs, retryOnLoss } from './failover.ts';
import { JobTrainer, type TrainingFailover } from './job-trainer.ts';
import { ownEndLayers, ownEnds } from './job-stage.ts';
import type { JobPlacement } from './placement.ts';
import type { ProgressReporter } from './progress.ts';
import type { JobRecovery } from './recovery.ts';
import { RedundantStage } from './redundant-stage.ts';
import { RemoteTrainStage } from './remote-train.ts';
import type { Replanner } from './replanner.ts';
import { ReplicaScorer, type ScoreOptions } from './scoring.ts';
import type { JobVerifier } from './verifier.ts';

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
  /**
   * Replicas add every micro-batch's gradient in the batch's order (each worker sends its micro-batches' gradients,
   * not their sum), so that their steps are one process's bit for bit. Default: on for a job with an adapter (its
   * factors are small), off otherwise (each replica's sum is sent: within float rounding of one process).
   */
  orderedReplicas?: boolean;
  /**
   * Scored contributions (with replicas and `syncEvery` > 1): before each average, every replica's
   * change is scored on the held-out micro-batch `score.batch(round)` gives, and a replica scored
   * below the floor in 2 rounds is excluded and the job replayed without it (src/user/scoring.ts).
   */
  score?: ScoreOptions;
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

/** The parts of a job its training drives: where its sections are, how it recovers, and who checks and watches it. */
export interface TrainingContext {
  placement: JobPlacement;
  recovery: JobRecovery;
  replanner: Replanner;
  verifier: JobVerifier | null;
  /** The user runs the model's ends itself (privacy 'ends'). */
  keepEnds: boolean;
  /** Tokens per step the plan was made for: its predicted seconds scale from there. */
  planTokens: number;
  /** The least a request waits before its worker is taken for lost. */
  deadlineFloorMs: number;
  progress: ProgressReporter | null;
}

/** A parameter's optimizer state as a checkpoint writes it: fetched from its holder when the writer gets to it. */
export interface OptimizerEntry {
  name: string;
  shape: number[];
  step: number;
  moments: () => Promise<Tensor>;
}

/** The first trusted worker of a stage (or the user's own stage): the one checkpoints read. */
function primaryOf(h: StageHandle): StageHandle {
  return h instanceof RedundantStage ? h.primary : h;
}

/**
 * A distributed job's training: its pipeline over the job's sections and the user's ends, the
 * trainer that drives it, copies of its state and rebuilds from them (failover), and its
 * optimizer state for checkpoints. Reads of that state go on across a lost worker: the job is
 * rebuilt from its last copy and the steps since replayed, so what is read is what was there.
 */
export class JobTraining {
  pipeline: PipelineTrainer | null = null;
  /** The trainer handed out, once start() ran: its last step's checks are settled before anything is read back. */
  trainer: JobTrainer | null = null;
  /** The last copy of the training job's state (null: none yet, or one a rollback made stale). */
  private snapshot: Snapshot | null = null;
  /** The optimizer every holder runs (re-execution runs the same), once start() ran. */
  optimizerSettings: { lr: number; weightDecay?: number } | null = null;
  /** Scores the replicas' changes before each average (DistributedTrainerOptions.score), once start() ran. */
  scorer: ReplicaScorer | null = null;

  constructor(private readonly ctx: TrainingContext) {}

  /** Whether the job trains: its workers hold weights the user's source does not. */
  get trains(): boolean {
    return this.pipeline !== null && this.trainer !== null;
  }

  /** Copies of each section that train different micro-batches: 1 when the copies are redundant. */
  get replicas(): number {
    return (this.ctx.verifier?.redundancy ?? 1) > 1 ? 1 : this.ctx.placement.sections[0].length;
  }

  /** Sets up training on the workers (their AdamW, the reductions among replicas, verification) and returns the trainer. */
  async start(o: DistributedTrainerOptions): Promise<JobTrainer> {
    const { placement, verifier, keepEnds } = this.ctx;
    const replicas = this.replicas;
    if (o.replicas !== undefined && o.replicas !== replicas) {
      throw new InvalidArgumentError(`the model was distributed with ${replicas} replica(s), the trainer asks for ${o.replicas}: pass replicas to distribute()`);
    }
    if (this.pipeline) throw new InvalidArgumentError('this distributed model already has a trainer');
    if (!verifier) throw new InvalidArgumentError('this job was made without a verifier: distribute() makes one');
    if (o.score) {
      if (replicas < 2 || (o.syncEvery ?? 1) < 2) throw new InvalidArgumentError('scoring replicas\' changes needs replicas that take local steps (replicas ≥ 2, syncEvery ≥ 2)');
      const ends = keepEnds ? ownEnds(placement.source) : null;
      const layers = ends && {
        first: ends.layers.slice(0, 1), last: ends.layers.slice(ends.layers.length - 2), maxPositions: ends.config.maxPositions,
      };
      this.scorer = new ReplicaScorer(o.score, layers, o.optimizer.weightDecay);
    }
    const { lr, weightDecay } = o.optimizer;
    this.optimizerSettings = { lr, ...(weightDecay === undefined ? {} : { weightDecay }) };
    // the user's ends as they start: a rollback restores them
    const start = keepEnds ? this.endParameters().map((t) => (t.data as Float32Array).slice()) : [];
    const restart = async () => {
      if (!placement.canReplan) throw new VerificationError('a worker was caught and this job cannot be planned again');
      // a worker caught may have steered every step: copies of the state are no longer trusted
      this.snapshot = null;
      await this.replan();
      if (keepEnds) this.endParameters().forEach((t, i) => (t.data as Float32Array).set(start[i]));
      return this.buildPipeline(o, verifier);
    };
    const pipeline = await this.buildPipeline(o, verifier);
    const trainer = new JobTrainer(pipeline, verifier, restart, o.failover === false ? null : this.failover(o, verifier, start));
    this.trainer = trainer;
    const progress = this.ctx.progress;
    if (progress) trainer.onStep = (r, tokens) => progress.trained(trainer.stepCount, r.loss, tokens, r.seconds, r.busy);
    return trainer;
  }

  /** A worker was lost outside a step (a generation, a read of the job's state): rebuilt from the last copy, the steps since replayed. */
  async heal(cause: unknown): Promise<void> {
    if (!this.trainer) throw cause;
    await this.trainer.heal(cause);
  }

  /** Waits for the checks still under way (the last step's re-runs, a rollback they call for, the ledger's submissions). */
  async settle(): Promise<void> {
    await this.trainer?.settle();
    await this.ctx.verifier?.drain();
  }

  /** The user's end parameters it trains (a frozen base under an adapter is left out), in layerParameters order. */
  private endParameters(): Tensor[] {
    return [...layerParameters(ownEndLayers(this.ctx.placement.source)).values()].filter((p) => p.requiresGrad);
  }

  /** Closes every section and places the job again (from `weights`, a copy, when given): the pipeline is rebuilt after. */
  private async replan(avoid?: ReadonlySet<string>, weights?: Map<string, Tensor>): Promise<void> {
    this.pipeline = null;
    await this.ctx.placement.replan(avoid, weights);
  }

  /** How this job survives a lost worker while it trains: copies of its state, and a rebuild from the last one. */
  private failover(o: DistributedTrainerOptions, verifier: JobVerifier, start: Float32Array[]): TrainingFailover {
    const { placement, recovery, replanner } = this.ctx;
    // the copy: every section's weights and their two moments
    const weights = placement.sections.flatMap(([s]) => placement.trainedOf(s));
    const bytes = 3 * 4 * weights.reduce((sum, w) => sum + w.shape.reduce((a, b) => a * b, 1), 0);
    const fits = bytes <= SNAPSHOT_MAX_BYTES;
    return {
      every: o.snapshotEvery ?? 0,
      intervalMs: o.snapshotEvery === undefined && fits ? SNAPSHOT_INTERVAL_MS : 0,
      take: async (step) => {
        this.snapshot = await this.takeSnapshot(step);
      },
      propose: () => replanner.betterPlan(),
      move: async (step, reason) => {
        // rebuilt from the copy just taken: nothing is replayed
        const pipeline = await this.rebuildFromSnapshot(o, verifier, start, await recovery.recentlyLost());
        replanner.moved(reason, step);
        return pipeline;
      },
      rebuild: async (cause, attempt) => {
        let pipeline: PipelineTrainer | null = null;
        await recovery.recover(cause, attempt, {
          during: 'training',
          rebuild: async (avoid) => {
            pipeline = await this.rebuildFromSnapshot(o, verifier, start, avoid);
          },
        });
        if (!pipeline) throw new StageFailedError(`the job could not be rebuilt after: ${(cause as Error).message}`, { cause });
        return { pipeline, from: this.snapshot?.step ?? 0 };
      },
      recovered: (replayed) => recovery.recovered(replayed),
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
    await this.replan(avoid, snap?.weights);
    const ends = snap?.ends ?? start;
    if (this.ctx.keepEnds) {
      // a step that failed in its flush left gradients on the user's ends: the replay starts without them
      this.endParameters().forEach((t, i) => {
        (t.data as Float32Array).set(ends[i]);
        t.grad = null;
      });
    }
    const pipeline = await this.buildPipeline(o, verifier);
    if (snap) {
      await Promise.all(this.handles().map((h) => h.setOptimizerState(snap.optimizer)));
      pipeline.fastForward(snap.step);
    }
    return pipeline;
  }

  /** Copies every section's weights (from its first holder) and every holder's optimizer state, and the user's ends. */
  private async takeSnapshot(step: number): Promise<Snapshot> {
    const { placement, keepEnds } = this.ctx;
    const weights = new Map<string, Tensor>();
    // each section from its own worker at once (one stream each), weight by weight
    await Promise.all(placement.sections.map(async ([s]) => {
      for (const w of placement.trainedOf(s)) weights.set(w.name, await s.remote.weight(w.name));
    }));
    const optimizer = new Map<string, { moments: Tensor; step: number }>();
    const states = await Promise.all(this.handles().map((h) => h.optimizerState()));
    for (const state of states) {
      // copied: the user's own ends hand out the moments they go on updating
      for (const [n, st] of state) {
        const moments = tensor((st.moments.data as Float32Array).slice(), st.moments.shape);
        if (!optimizer.has(n)) optimizer.set(n, { moments, step: st.step });
      }
    }
    const ends = keepEnds ? this.endParameters().map((t) => (t.data as Float32Array).slice()) : [];
    return { step, weights, optimizer, ends };
  }

  private async buildPipeline(o: DistributedTrainerOptions, verifier: JobVerifier): Promise<PipelineTrainer> {
    const { placement, keepEnds, planTokens, deadlineFloorMs } = this.ctx;
    const replicas = this.replicas;
    const executor = { lr: o.optimizer.lr, weightDecay: o.optimizer.weightDecay, recompute: o.recompute };
    // the job's other holders may send gradients (the validator, named at load, may fetch what re-running a record needs)
    const peers = placement.assignment.map((a) => a.peerId);
    // a forward or backward may take DEADLINE_SLACK times the plan's prediction (a backward costs about twice a forward)
    const deadline = (i: number) => (tokens: number) => {
      return deadlineMs((3 * (placement.plan.stages[i]?.seconds ?? 0) * tokens) / planTokens, deadlineFloorMs);
    };
    const handles = placement.sections.map((copies, i) =>
      copies.map((s) => new RemoteTrainStage(s.remote, s.where, `worker ${s.where.peerId}, layers ${s.where.start}–${s.where.end - 1}`, deadline(i))));
    const compressGrads = o.compressGrads ? { compressGrads: checkDctTopk(o.compressGrads) } : {};
    // local steps average replicas: with none, the job's steps are those of one process
    const sync = (o.syncEvery ?? 1) > 1 && replicas > 1 ? { syncEvery: o.syncEvery } : {};
    const keepState = verifier.keepsState;
    // replicas of an adapter's factors reduce micro-batch by micro-batch, in order: one process's steps, bit for bit
    const ordered = replicas > 1 && !o.compressGrads && !sync.syncEvery && (o.orderedReplicas ?? placement.source.adapter != null);
    const keepMicros = ordered ? { keepMicros: true } : {};
    await Promise.all(handles.flat().map((h) => h.setup({ ...executor, keepState, peers, ...compressGrads, ...sync, ...keepMicros })));
    for (const h of handles.flat()) {
      if (!o.relay) h.direct = h.peerId;
      h.codec = o.compressActivations ?? null;
      // its sessions (evaluation, generation) send hidden states the same way
      h.stage.codec = h.codec;
    }
    const onFlag = async (lane: RemoteTrainStage) => {
      // a worker caught cheating leaves the job: its stage is closed and it is no longer a copy of its section
      const stage = placement.all.find((s) => s.remote === lane.stage);
      if (stage) await placement.exclude(stage);
    };
    // redundant copies run the same micro-batches as one stage; replicas run their own
    const middle: PipelineStage[] = handles.map((hs) => ({
      replicas: replicas === 1 ? [new RedundantStage(hs, verifier, onFlag)] : hs.map((h) => new RedundantStage([h], verifier, onFlag)),
    }));
    const ends = keepEnds ? userEnds(ownEnds(placement.source), executor) : null;
    this.pipeline = new PipelineTrainer(ends ? [ends.first, ...middle, ends.last] : middle, {
      lr: o.optimizer.lr,
      totalSteps: o.totalSteps,
      warmupSteps: o.warmupSteps,
      clipNorm: o.clipNorm,
      microBatches: o.microBatches ?? replicas,
      schedule: o.schedule,
      ...sync,
      ...(ordered ? { orderedReplicas: true } : {}),
    });
    if (this.scorer) this.pipeline.beforeAverage = this.scorer.beforeAverage(handles, verifier);
    return this.pipeline;
  }

  /** Every holder of parameters in the pipeline (replicas too). */
  private handles(): StageHandle[] {
    return this.pipeline?.stages.flatMap((st) => st.replicas) ?? [];
  }

  /** Adds what each worker reported sending at its last step to `total`. */
  addTraffic(total: Traffic): void {
    for (const h of this.handles()) if (h instanceof RedundantStage) for (const lane of h.lanes) addTraffic(total, lane.workerTraffic);
  }

  /** The pipeline, or the typed error of a job asked for training state before it trains. */
  private trained(): PipelineTrainer {
    if (!this.pipeline) throw new InvalidArgumentError('this distributed model has no trainer yet: call trainer() first');
    return this.pipeline;
  }

  /** Runs `read` on the job as it is; a worker lost meanwhile is replaced (the job rebuilt from its copy) and `read` run again. */
  private readAcross<T>(read: () => Promise<T>): Promise<T> {
    return retryOnLoss(read, (cause, attempt) => this.ctx.recovery.recover(cause, attempt));
  }

  /** AdamW's state of every parameter that has taken a step, from its first holder. */
  async optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>> {
    this.trained();
    await this.settle();
    return this.readAcross(async () => {
      const out = new Map<string, { moments: Tensor; step: number }>();
      for (const h of this.handles()) {
        for (const [n, s] of await h.optimizerState()) if (!out.has(n)) out.set(n, s);
      }
      return out;
    });
  }

  /**
   * AdamW's state parameter by parameter, for checkpoints of models larger than the user's
   * memory: each parameter that has taken a step, its shape and step count, and a fetch of its
   * moments ([2, ...shape]) from its first holder when the writer gets to it (from the holder
   * then: a worker lost meanwhile is replaced first).
   */
  async optimizerEntries(): Promise<OptimizerEntry[]> {
    this.trained();
    await this.settle();
    const { placement } = this.ctx;
    const shapes = new Map<string, number[]>();
    for (const [s] of placement.sections) for (const w of placement.trainedOf(s)) shapes.set(w.name, w.shape);
    return this.readAcross(async () => {
      const out: OptimizerEntry[] = [];
      const seen = new Set<string>();
      for (const stage of this.trained().stages) {
        const h = primaryOf(stage.replicas[0]);
        const steps = h instanceof RemoteTrainStage
          ? (await h.momentSteps()).map(({ name, step }) => ({ name, step, shape: shapes.get(name)! }))
          // the user's own ends: small, and in this process
          : [...await h.optimizerState()].map(([name, s]) => ({ name, step: s.step, shape: s.moments.shape.slice(1) }));
        for (const { name, step, shape } of steps) {
          if (seen.has(name)) continue;
          seen.add(name);
          out.push({ name, shape, step, moments: () => this.readAcross(() => this.momentsOf(name)) });
        }
      }
      return out;
    });
  }

  /** The moments ([2, ...shape]) of parameter `name` from its first holder in the pipeline as it is now. */
  private async momentsOf(name: string): Promise<Tensor> {
    for (const stage of this.trained().stages) {
      const h = primaryOf(stage.replicas[0]);
      if (!h.names.includes(name)) continue;
      if (h instanceof RemoteTrainStage) return h.moments(name);
      const s = (await h.optimizerState()).get(name);
      if (s) return s.moments;
    }
    throw new InvalidArgumentError(`no holder of '${name}' in this job has optimizer state for it`);
  }

  /** Restores AdamW's state parameter by parameter (`read` gives its moments and step, or null): resuming without holding it all. */
  async restoreOptimizer(read: (name: string) => { moments: Tensor; step: number } | null): Promise<void> {
    this.trained();
    for (const h of this.handles()) {
      for (const name of h.names) {
        const s = read(name);
        if (s) await h.setOptimizerState(new Map([[name, s]]));
      }
    }
  }

  /** Gives every holder (replicas too) its parameters' optimizer state: resuming from a checkpoint. */
  async setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void> {
    this.trained();
    await Promise.all(this.handles().map((h) => h.setOptimizerState(state)));
  }
}
