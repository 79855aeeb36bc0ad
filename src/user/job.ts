import { randomUUID } from 'node:crypto';
import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError } from '../errors.ts';
import {
  type CausalLM, configToHF, defaultPositions, type GenerateOptions, generateWith, runLayers, type StepModel,
} from '../models/index.ts';
import type { PeerTarget, StageAssignment } from '../p2p/index.ts';
import { type PipelineStage, PipelineTrainer, type ScheduleName, sectionWeights, userEnds } from '../pipeline/index.ts';
import type { Plan } from '../plan/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { RemoteStage } from './remote-stage.ts';
import { RemoteTrainStage } from './remote-train.ts';
import type { ResultInbox } from './result-inbox.ts';

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
}

/** A model split across workers; the user holds its ends. */
export interface DistributedModel {
  readonly plan: Plan;
  /** Which worker runs which layers (global layer indices, end exclusive), for each replica. */
  readonly assignment: { peerId: string; start: number; end: number; replica: number }[];
  generate(prompt: number[], options?: GenerateOptions): Promise<{ tokens: number[] }>;
  generateBatch(prompts: number[][], options?: GenerateOptions): Promise<{ tokens: number[][] }>;
  /** The logits [B, T, V] of token ids [B, T] (int32), computed across the workers in a session of its own. */
  logits(ids: Tensor): Promise<Tensor>;
  /** Sets up training on the workers (their AdamW, the reductions among replicas) and returns the trainer. */
  trainer(options: DistributedTrainerOptions): Promise<PipelineTrainer>;
  /** AdamW's state of every parameter that has taken a step, from its first holder: for checkpoints. */
  optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>>;
  /** Gives every holder (replicas too) its parameters' optimizer state: resuming from a checkpoint. */
  setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void>;
  /** Brings the workers' current weights into the user's model (to save it, or to run it alone) and returns it. */
  pull(): Promise<CausalLM>;
  /** Ends the job: every worker frees its section, caches and training state. */
  close(): Promise<void>;
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
  /** The workers' training handles, [section][replica], once trainer() ran. */
  private training: RemoteTrainStage[][] = [];
  private readonly keepEnds: boolean;

  constructor(
    private readonly node: Libp2p,
    readonly jobId: string,
    readonly model: CausalLM,
    readonly plan: Plan,
    private readonly sections: JobStage[][],
    /** Where chained results arrive; null: the user relays hidden states between workers. */
    private readonly inbox: ResultInbox | null,
    options: { keepEnds: boolean },
  ) {
    this.keepEnds = options.keepEnds;
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

  /** Loads every section on its worker (the first replica of each section after the previous one's, for the chain). */
  async load(): Promise<void> {
    const assignment = this.fullAssignment();
    for (const [i, copies] of this.sections.entries()) {
      for (const s of copies) await this.loadStage(i, s, assignment);
    }
  }

  private async loadStage(section: number, s: JobStage, assignment: StageAssignment[]): Promise<void> {
    const range: [number, number] = [s.where.start, s.where.end];
    const weights = sectionWeights(this.model, range);
    await s.remote.load(configToHF(this.model.config), range, weights, this.upstreamOf(section, s), { assignment });
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
    await old.remote.close();
    await Promise.all(
      this.sections.flatMap((copies, i) =>
        copies.filter((s) => s !== fresh).map((s) => {
          const upstream = this.upstreamOf(i, s);
          return s.remote.call({ type: 'assign', assignment, ...(upstream ? { upstream } : {}) }, []);
        })),
    );
  }

  private runEnd(range: [number, number], x: Tensor, positions: Tensor): Tensor {
    return noGrad(() => runLayers(this.model.layers.slice(range[0], range[1]), x, { positions }, this.model.config.maxPositions));
  }

  /** One step of a session through the job: the user's first end, the workers, the user's last end. */
  private stepModel(sessionId: string): StepModel {
    const layerCount = this.model.config.layers;
    const total = layerCount + 3;
    return {
      maxPositions: this.model.config.maxPositions,
      eosTokenId: this.model.tokenizer?.eosTokenId ?? this.model.config.eosTokenId ?? null,
      step: async (ids, opts) => {
        const positions = opts.positions!;
        const keyMask = opts.keyMask ?? null;
        let x: Tensor = this.keepEnds ? this.runEnd([0, 1], ids, positions) : ids;
        const route = this.route();
        if (this.inbox) {
          const { requestId, result } = this.inbox.expect(new Set(route.map((s) => s.where.peerId)));
          const peers = route.slice(1).map((s) => s.where.peerId);
          await route[0].remote.forwardChained(sessionId, keyMask ? [x, positions, keyMask] : [x, positions], peers, requestId);
          x = await result;
        } else {
          for (const s of route) x = await s.remote.forward(sessionId, x, positions, keyMask);
        }
        return this.keepEnds ? this.runEnd([layerCount + 1, total], x, positions) : x;
      },
    };
  }

  private async session<T>(run: (session: string) => Promise<T>): Promise<T> {
    const session = randomUUID();
    try {
      return await run(session);
    } finally {
      await Promise.all(this.route().map((s) => s.remote.closeSession(session).catch(() => {})));
    }
  }

  async generate(prompt: number[], options: GenerateOptions = {}): Promise<{ tokens: number[] }> {
    return { tokens: (await this.session((id) => generateWith(this.stepModel(id), [prompt], options)))[0] };
  }

  async generateBatch(prompts: number[][], options: GenerateOptions = {}): Promise<{ tokens: number[][] }> {
    return { tokens: await this.session((id) => generateWith(this.stepModel(id), prompts, options)) };
  }

  async logits(ids: Tensor): Promise<Tensor> {
    if (ids.dtype !== 'int32' || ids.ndim !== 2) throw new InvalidArgumentError(`logits takes int32 ids [batch, time], got ${ids.dtype} [${ids.shape}]`);
    const positions = defaultPositions(ids.shape[0], ids.shape[1], 0);
    return this.session(async (id) => this.stepModel(id).step(ids, { positions, keyMask: null }));
  }

  async trainer(o: DistributedTrainerOptions): Promise<PipelineTrainer> {
    const replicas = this.sections[0].length;
    if (o.replicas !== undefined && o.replicas !== replicas) {
      throw new InvalidArgumentError(`the model was distributed with ${replicas} replica(s), the trainer asks for ${o.replicas}: pass replicas to distribute()`);
    }
    if (this.pipeline) throw new InvalidArgumentError('this distributed model already has a trainer');
    const executor = { lr: o.optimizer.lr, weightDecay: o.optimizer.weightDecay, recompute: o.recompute };
    const peers = this.assignment.map((a) => a.peerId);
    const handles = this.sections.map((copies) =>
      copies.map((s) => new RemoteTrainStage(s.remote, s.where, `worker ${s.where.peerId}, layers ${s.where.start}–${s.where.end - 1}`)));
    await Promise.all(handles.flat().map((h) => h.setup({ ...executor, peers })));
    this.training = handles;
    const middle: PipelineStage[] = handles.map((hs) => ({ replicas: hs }));
    const ends = this.keepEnds ? userEnds(this.model, executor) : null;
    this.pipeline = new PipelineTrainer(ends ? [ends.first, ...middle, ends.last] : middle, {
      lr: o.optimizer.lr,
      totalSteps: o.totalSteps,
      warmupSteps: o.warmupSteps,
      clipNorm: o.clipNorm,
      microBatches: o.microBatches ?? replicas,
      schedule: o.schedule,
    });
    return this.pipeline;
  }

  async optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>> {
    if (!this.pipeline) throw new InvalidArgumentError('this distributed model has no trainer yet: call trainer() first');
    const out = new Map<string, { moments: Tensor; step: number }>();
    for (const h of this.pipeline.stages.flatMap((s) => s.replicas)) {
      for (const [n, s] of await h.optimizerState()) if (!out.has(n)) out.set(n, s);
    }
    return out;
  }

  async setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void> {
    if (!this.pipeline) throw new InvalidArgumentError('this distributed model has no trainer yet: call trainer() first');
    await Promise.all(this.pipeline.stages.flatMap((s) => s.replicas).map((h) => h.setOptimizerState(state)));
  }

  async pull(): Promise<CausalLM> {
    for (const copies of this.training) this.model.loadStateDict(await copies[0].weights(), { strict: false });
    return this.model;
  }

  async close(): Promise<void> {
    await Promise.all(this.sections.flat().map((s) => s.remote.close()));
  }
}
