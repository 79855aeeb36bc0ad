import { join } from 'node:path';
import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError } from '../errors.ts';
import {
  ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapterState, type CausalLM, type GenerateOptions, layerParameters, saveModelStreamed,
  type SpeculativeOptions, type SpeculativeResult, writeAdapter,
} from '../models/index.ts';
import { addTraffic, type DialTarget, newTraffic, type PeerTarget, type Traffic } from '../p2p/index.ts';
import type { Plan } from '../plan/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { DEADLINE_FLOOR_MS, type FailoverEvent, isLoss, retryOnLoss } from './failover.ts';
import { JobSessions } from './job-sessions.ts';
import { type JobStage, ownEndLayers } from './job-stage.ts';
import type { JobTrainer } from './job-trainer.ts';
import { type DistributedTrainerOptions, JobTraining, type OptimizerEntry } from './job-training.ts';
import { JobPlacement } from './placement.ts';
import { type Learning, ProgressReporter } from './progress.ts';
import { JobRecovery, type RecoverOptions } from './recovery.ts';
import type { LoadProgress, LoadResult } from './remote-stage.ts';
import { type ProposeReplan, type ReplanEvent, Replanner } from './replanner.ts';
import type { ResultInbox } from './result-inbox.ts';
import type { UserModel } from './user-model.ts';
import type { JobVerifier, VerificationSummary } from './verifier.ts';

// the names of the job's parts that its users see (index.ts, distribute.ts)
export { type JobStage, type Placement } from './job-stage.ts';
export { type DistributedTrainerOptions, SNAPSHOT_INTERVAL_MS, SNAPSHOT_MAX_BYTES } from './job-training.ts';
export { LOAD_CONCURRENCY } from './placement.ts';
export { LOST_AVOID_MS } from './recovery.ts';
export { REPLAN_CHECK_MS, type ReplanEvent, type ReplanProposal, UNCHANGED_GAIN } from './replanner.ts';

/** A model split across workers; the user holds its ends. */
export interface DistributedModel {
  /** The job's id on the workers (a job planned again after a worker was caught runs under a new one): its records and escrow name it. */
  readonly jobId: string;
  readonly plan: Plan;
  /** Which worker runs which layers (global layer indices, end exclusive), for each replica. */
  readonly assignment: { peerId: string; start: number; end: number; replica: number }[];
  generate(prompt: number[], options?: GenerateOptions): Promise<{ tokens: number[] }>;
  generateBatch(prompts: number[][], options?: GenerateOptions): Promise<{ tokens: number[][] }>;
  /**
   * Continues one prompt by speculative decoding: drafts (prompt lookup) checked several per pass through the workers,
   * which keep the accepted positions only. Greedy, the tokens equal `generate`'s; `passes` counts trips through them.
   */
  generateSpeculative(prompt: number[], options: SpeculativeOptions): Promise<SpeculativeResult>;
  /** The logits [B, T, V] of token ids [B, T] (int32), computed across the workers in a session of its own. */
  logits(ids: Tensor): Promise<Tensor>;
  /** Sets up training on the workers (their AdamW, the reductions among replicas, verification) and returns the trainer. */
  trainer(options: DistributedTrainerOptions): Promise<JobTrainer>;
  /** Reinforcement learning's figures for the dashboard, carried by the next training step's report (the job shows as 'rl'). */
  annotateProgress(figures: Learning): void;
  /** AdamW's state of every parameter that has taken a step, from its first holder: for checkpoints. */
  optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>>;
  /** Gives every holder (replicas too) its parameters' optimizer state: resuming from a checkpoint. */
  setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void>;
  /** Brings the workers' weights into the user's model (to run it alone) and returns it: only when the user holds the whole model. */
  pull(): Promise<CausalLM>;
  /** Writes the model as it is now to a Hugging Face directory, weight by weight as they arrive from the workers. */
  save(dir: string, options?: { maxShardBytes?: number }): Promise<string[]>;
  /** A job with an adapter: its LoRA factors as they are now (the user's ends' and each section's), by their names in the model. */
  adapterFactors(): Promise<Map<string, Tensor>>;
  /** A job with an adapter that does not train: puts `factors` on it (another job's adapterFactors), loading only them. */
  setAdapter(factors: Map<string, Tensor>): Promise<void>;
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

/**
 * A job distributed over workers: sections[i][r] is replica r of the i-th section. Generation
 * runs on replica 0 of each section, chained worker to worker (or relayed by the user); the
 * user's ends run on its own model. A section's worker can be replaced (`replaceStage`): the
 * new worker loads the section, every worker of the job learns the new assignment, and the
 * next generation step takes the new route.
 *
 * The job is its parts, each in a file of its own: where its sections are (placement.ts), how it
 * goes on after a lost worker (recovery.ts), when it moves to a better plan (replanner.ts), its
 * sessions (job-sessions.ts) and its training (job-training.ts). Whatever it reads back from its
 * workers (weights for save and pull, optimizer state) survives a lost worker the same way a step
 * does: the job is rebuilt, and what is read is what was there.
 */
export class DistributedJob implements DistributedModel {
  private readonly placement: JobPlacement;
  private readonly recovery: JobRecovery;
  private readonly replanner: Replanner;
  private readonly training: JobTraining;
  private readonly sessions: JobSessions;
  /** Reports the job's progress to the validator's dashboard (null: no validator to tell). */
  private readonly progress: ProgressReporter | null;
  /** Checks the workers' records: sampled re-execution, redundant copies compared. */
  readonly verifier: JobVerifier | null;
  private readonly keepEnds: boolean;

  constructor(
    node: Libp2p,
    jobId: string,
    /** What the user holds of the model: its ends (or the whole model) and where sections come from. */
    readonly source: UserModel,
    plan: Plan,
    /** sections[i][c]: copy c of the i-th section (a replica for data parallelism, or a redundant copy). */
    sections: JobStage[][],
    /** Where chained results arrive; null: the user relays hidden states between workers. */
    inbox: ResultInbox | null,
    options: {
      keepEnds: boolean;
      onProgress?: (stage: JobStage, progress: LoadProgress) => void;
      verifier?: JobVerifier | null;
      /** Plans and opens the job again on the workers still trusted and not in `avoid` (a rollback, a failover). */
      relocate?: (avoid?: ReadonlySet<string>) => Promise<{ jobId: string; plan: Plan; sections: JobStage[][] }>;
      /** Where to ask for live workers (spares for a failover); none: the job cannot fail over to a spare. */
      validator?: DialTarget;
      /** Tokens per step the plan was made for: its predicted seconds scale from there. */
      tokens?: number;
      /** The least a request waits before its worker is taken for lost (default DEADLINE_FLOOR_MS). */
      deadlineFloorMs?: number;
      /** Proposes a better plan under the swarm as it is now (null: keep this one). */
      propose?: ProposeReplan;
      /** The model's name on the validator's dashboard. */
      name?: string;
    },
  ) {
    this.keepEnds = options.keepEnds;
    this.verifier = options.verifier ?? null;
    const verifier = this.verifier;
    const placement = new JobPlacement(node, jobId, plan, sections, source, inbox, {
      verifier, relocate: options.relocate ?? null, ...(options.onProgress ? { onProgress: options.onProgress } : {}),
    });
    this.placement = placement;
    this.recovery = new JobRecovery(node, placement, verifier, options.validator ?? null, {
      trains: () => this.training.trains,
      heal: (cause) => this.training.heal(cause),
    });
    this.replanner = new Replanner(options.propose ?? null, placement, this.recovery);
    const shown = () => ({ jobId: placement.jobId, stages: this.stagesShown() });
    this.progress = options.validator ? new ProgressReporter(node, options.validator, shown, options.name) : null;
    const planTokens = options.tokens ?? 1;
    const deadlineFloorMs = options.deadlineFloorMs ?? DEADLINE_FLOOR_MS;
    const parts = {
      placement, recovery: this.recovery, replanner: this.replanner, verifier, keepEnds: this.keepEnds, planTokens, deadlineFloorMs,
    };
    this.training = new JobTraining({ ...parts, progress: this.progress });
    this.sessions = new JobSessions({ ...parts, inbox, trains: () => this.training.trains, settle: () => this.settle(),
      // workers caught in a session of the training job: it is rolled back and replayed without them (JobTrainer.caught)
      caught: (failed) => this.training.trainer!.caught(failed),
    });
  }

  get jobId(): string {
    return this.placement.jobId;
  }

  get plan(): Plan {
    return this.placement.plan;
  }

  get assignment(): { peerId: string; start: number; end: number; replica: number }[] {
    return this.placement.assignment;
  }

  get failovers(): readonly FailoverEvent[] {
    return this.recovery.failovers;
  }

  get replans(): readonly ReplanEvent[] {
    return this.replanner.replans;
  }

  /** The optimizer every holder runs (re-execution runs the same), once trainer() ran. */
  get optimizerSettings(): { lr: number; weightDecay?: number } | null {
    return this.training.optimizerSettings;
  }

  /** What verification has done in this job so far. */
  get verification(): VerificationSummary | null {
    const summary = this.verifier?.summary;
    return summary ? { ...summary, flagged: [...summary.flagged], left: [...summary.left], byBackend: { ...summary.byBackend } } : null;
  }

  /** The plan as the dashboard shows it: each section's layers and the workers holding its copies. */
  private stagesShown(): { start: number; end: number; peers: string[] }[] {
    return this.placement.sections.map((copies) => ({
      start: copies[0].where.start, end: copies[0].where.end, peers: copies.map((c) => c.where.peerId),
    }));
  }

  /**
   * Bytes the job moved so far, by kind: what this user sent to its workers and what each worker
   * reported sending at its last step (hops, gradients among replicas, weights, control).
   * Workers the job left (failover) are no longer counted.
   */
  traffic(): Traffic {
    const total = newTraffic();
    for (const s of this.placement.all) addTraffic(total, s.remote.traffic);
    this.training.addTraffic(total);
    return total;
  }

  /** The chain of generation: replica 0 of every section, in order. */
  route(): JobStage[] {
    return this.placement.route();
  }

  /** Loads every section on its worker (see JobPlacement.load). */
  load(): Promise<LoadResult[]> {
    return this.placement.load();
  }

  /**
   * Moves replica `replica` of section `section` to another worker: opens the job there, loads
   * the section (content-addressed: only chunks it lacks move), tells every worker of the job
   * the new assignment, and closes the old stage. Generation continues on the new route.
   */
  async replaceStage(section: number, replica: number, worker: PeerTarget): Promise<void> {
    if (this.training.pipeline) throw new InvalidArgumentError('the stages of a job that trains cannot be replaced yet: the trainer holds them');
    await this.placement.replaceStage(section, replica, worker);
  }

  /** A step failed with `cause`: the lost workers are replaced (see JobRecovery.recover). */
  recover(cause: unknown, attempt: number, options?: RecoverOptions): Promise<void> {
    return this.recovery.recover(cause, attempt, options);
  }

  /** The first result after a failover came: how long recovery took and what was replayed. */
  recovered(replayed: number): void {
    this.recovery.recovered(replayed);
  }

  /** A generation call answered: its tokens go on the dashboard (a training job reports its steps instead). */
  private async reported<T>(run: () => Promise<T>, tokens: (result: T) => number): Promise<T> {
    const started = performance.now();
    const result = await run();
    if (!this.training.trainer) this.progress?.generated(tokens(result), (performance.now() - started) / 1000);
    return result;
  }

  async generate(prompt: number[], options: GenerateOptions = {}): Promise<{ tokens: number[] }> {
    const rows = await this.reported(() => this.sessions.generate([prompt], options), (t) => t[0].length);
    return { tokens: rows[0] };
  }

  async generateBatch(prompts: number[][], options: GenerateOptions = {}): Promise<{ tokens: number[][] }> {
    const rows = await this.reported(() => this.sessions.generate(prompts, options), (t) => t.reduce((sum, row) => sum + row.length, 0));
    return { tokens: rows };
  }

  generateSpeculative(prompt: number[], options: SpeculativeOptions): Promise<SpeculativeResult> {
    return this.reported(() => this.sessions.speculate(prompt, options), (r) => r.tokens.length);
  }

  logits(ids: Tensor): Promise<Tensor> {
    return this.sessions.logits(ids);
  }

  annotateProgress(figures: Learning): void {
    this.progress?.annotate(figures);
  }

  trainer(options: DistributedTrainerOptions): Promise<JobTrainer> {
    if (this.source.format && !this.source.adapter) {
      return Promise.reject(new InvalidArgumentError(`this job's sections are held in ${this.source.format}, which is frozen: it cannot train (an adapter over it can: distribute(…, { adapter }))`));
    }
    return this.training.start(options);
  }

  /** Settles the checks still under way (the last training step's re-runs): anything read from the workers after this is verified. */
  async settle(): Promise<VerificationSummary | null> {
    await this.training.settle();
    return this.verification;
  }

  optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>> {
    return this.training.optimizerState();
  }

  /**
   * AdamW's state parameter by parameter, for checkpoints of models larger than the user's
   * memory: each parameter that has taken a step, its shape and step count, and a fetch of its
   * moments ([2, ...shape]) from its first holder when the writer gets to it.
   */
  optimizerEntries(): Promise<OptimizerEntry[]> {
    return this.training.optimizerEntries();
  }

  /** Restores AdamW's state parameter by parameter (`read` gives its moments and step, or null): resuming without holding it all. */
  restoreOptimizer(read: (name: string) => { moments: Tensor; step: number } | null): Promise<void> {
    return this.training.restoreOptimizer(read);
  }

  setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void> {
    return this.training.setOptimizerState(state);
  }

  /**
   * Weight `name` as its section's first holder has it now. A worker lost meanwhile is replaced
   * first (a training job is rebuilt from its last copy and its steps since replayed), so the
   * weight read is the one the job held before the loss (bit for bit on js).
   */
  private weight(name: string): Promise<Tensor> {
    return retryOnLoss(() => this.placement.holderOf(name).remote.weight(name), (cause, attempt) => this.recovery.recover(cause, attempt));
  }

  /** The names of the weights the workers hold, section by section. */
  private workerWeights(): { name: string; shape: number[] }[] {
    return this.placement.sections.flatMap(([s]) => [...this.placement.weightsOf(s)]);
  }

  async pull(): Promise<CausalLM> {
    const model = this.source.whole;
    if (!model) throw new InvalidArgumentError('the user holds only the ends of this model: write its weights with save(dir) instead of pulling them into memory');
    await this.settle();
    // every weight first, then into the model at once: until the last has come, the model still holds the job's start, which a
    // failover on the way may rebuild the job from
    const weights = new Map<string, Tensor>();
    for (const { name } of this.workerWeights()) weights.set(name, await this.weight(name));
    model.loadStateDict(weights, { strict: false });
    // the model the job was distributed from now holds trained weights: a rollback can no longer reload its start from it
    this.placement.sourceSpent = true;
    return model;
  }

  /**
   * Writes the model as it is now (the user's ends and every worker's section) to `dir` in
   * Hugging Face's layout, sharded above `maxShardBytes`: each weight is fetched from its first
   * holder and written as it arrives, so the user never holds more than one weight. A worker lost
   * on the way is replaced before its weights are fetched (see `weight`): the files are the job's.
   */
  async save(dir: string, options: { maxShardBytes?: number } = {}): Promise<string[]> {
    if (this.source.adapter) return this.saveAdapter(dir);
    await this.settle();
    const from = new Map<string, () => Promise<Tensor>>();
    const planned: { name: string; shape: number[] }[] = [];
    const add = (name: string, shape: readonly number[], get: () => Promise<Tensor>) => {
      if (from.has(name)) return; // a tied table held at both ends is written once
      from.set(name, get);
      planned.push({ name, shape: [...shape] });
    };
    // the user's own layers only (a whole model in memory has stale copies of the workers' sections)
    if (this.keepEnds) for (const [name, t] of layerParameters(ownEndLayers(this.source))) add(name, t.shape, async () => t);
    for (const { name, shape } of this.workerWeights()) add(name, shape, () => this.weight(name));
    return saveModelStreamed(dir, this.source.config, this.source.tokenizer, planned, (name) => from.get(name)!(), options);
  }

  /**
   * Writes the job's LoRA adapter as it is now in PEFT's layout (adapter_config.json, adapter_model.safetensors under
   * PEFT's keys): the factors on the user's ends and each section's from its first holder. What `save` writes for a
   * job with an adapter (the frozen base is the checkpoint it came from).
   */
  async saveAdapter(dir: string): Promise<string[]> {
    const adapter = this.source.adapter;
    if (!adapter) throw new InvalidArgumentError('this job has no adapter: save(dir) writes its model');
    writeAdapter(await this.adapterFactors(), adapter.config, dir, this.source.dir ?? '');
    return [join(dir, ADAPTER_CONFIG), join(dir, ADAPTER_WEIGHTS)];
  }

  /**
   * The job's LoRA factors as they are now, by their names in the model (`…lora_A.weight`): the user's ends' and each
   * section's from its first holder, once the last step's checks are settled.
   */
  async adapterFactors(): Promise<Map<string, Tensor>> {
    if (!this.source.adapter) throw new InvalidArgumentError('this job has no adapter');
    await this.settle();
    const state = new Map<string, Tensor>();
    if (this.keepEnds && this.source.ends) for (const [name, t] of adapterState(this.source.ends)) state.set(name, t);
    // each section's from its own worker at once (one stream each), weight by weight; a worker lost on the way: one
    // weight after another, each replacing a lost worker first (two replacements must not run at once)
    const names = this.placement.sections.map(([s]) => this.placement.trainedOf(s).map((w) => w.name));
    const read = await Promise.all(this.placement.sections.map(async ([s], i) => {
      const got: [string, Tensor][] = [];
      for (const name of names[i]) got.push([name, await s.remote.weight(name)]);
      return got;
    })).catch(async (err: unknown) => {
      if (!isLoss(err)) throw err;
      const got: [string, Tensor][] = [];
      for (const name of names.flat()) got.push([name, await this.weight(name)]);
      return [got];
    });
    for (const [name, t] of read.flat()) state.set(name, t);
    return state;
  }

  /** The hash of the factors setAdapter put on a section of layers `range` (undefined: none were, or the job trains them since). */
  factorsOf(range: readonly [number, number]): string | undefined {
    return this.training.trains ? undefined : this.placement.factorsOf(range);
  }

  /**
   * Puts `factors` (adapterFactors' of another job of the same adapter) on this job, which does not train: the user's
   * ends take theirs, and every section is loaded again with its own (content-addressed chunks: only the factors move;
   * over a hosted model the hosts' blocks stay). Sessions after it compute with them, as would a job started from them.
   */
  async setAdapter(factors: Map<string, Tensor>): Promise<void> {
    if (!this.source.adapter) throw new InvalidArgumentError('this job has no adapter to set');
    if (this.training.trains) throw new InvalidArgumentError('this job trains its adapter: set factors on a job that does not train');
    await this.settle();
    const onWorkers = new Map<string, Tensor>();
    const ends = this.keepEnds && this.source.ends ? adapterState(this.source.ends) : new Map<string, Tensor>();
    for (const [name, t] of factors) {
      const own = ends.get(name);
      if (!own) {
        onWorkers.set(name, t);
        continue;
      }
      if (own.shape.join() !== t.shape.join()) throw new InvalidArgumentError(`'${name}' is [${own.shape}] on this job, not [${t.shape}]`);
      (own.data as Float32Array).set(t.data as Float32Array);
    }
    // a worker lost on the way is replaced (its section loaded with the new factors) and the load tried again
    await retryOnLoss(() => this.placement.setWeights(onWorkers), (cause, attempt) => this.recovery.recover(cause, attempt));
  }

  async close(): Promise<void> {
    await this.progress?.closed();
    await this.verifier?.drain();
    await this.placement.close();
    this.source.close();
  }
}
