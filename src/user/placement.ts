import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError, VerificationError } from '../errors.ts';
import { configToHF, isAdapterWeight } from '../models/index.ts';
import type { PeerTarget, StageAssignment } from '../p2p/index.ts';
import type { Plan } from '../plan/index.ts';
import type { Tensor } from '../tensor/index.ts';
import { factorsHash } from '../verify/index.ts';
import type { JobStage, Placement } from './job-stage.ts';
import { type LoadProgress, type LoadResult, RemoteStage } from './remote-stage.ts';
import type { ResultInbox } from './result-inbox.ts';
import { overlaySource } from './section-source.ts';
import type { UserModel } from './user-model.ts';
import type { JobVerifier } from './verifier.ts';

/** Sections loaded at once: each holds a few chunks in flight, so the user's memory stays bounded however many workers there are. */
export const LOAD_CONCURRENCY = 4;

/** How a placement loads its sections and places the job again. */
export interface PlacementOptions {
  onProgress?: (stage: JobStage, progress: LoadProgress) => void;
  /** The validator that may fetch what re-running a section's records needs (named to each worker at load). */
  verifier: JobVerifier | null;
  /** Plans and opens the job again on the workers still trusted and not in `avoid` (a rollback, a failover); null: it cannot be. */
  relocate: ((avoid?: ReadonlySet<string>) => Promise<Placement>) | null;
}

/**
 * Where a distributed job's sections are and how they get there: sections[i][c] is copy c of
 * the i-th section (a replica for data parallelism, or a redundant copy). It loads them from
 * the user's source (or a copy of a training job's state), moves one to another worker, and
 * places the whole job again (planned anew over the live workers).
 */
export class JobPlacement implements Placement {
  /** While set, sections load from these weights (a copy of a training job's state) instead of the user's source. */
  private loadFrom: Map<string, Tensor> | null = null;
  /**
   * Weights set on the job after it was placed (an adapter's factors, `setWeights`): every later load (a failover, a
   * re-plan) takes them over the user's source.
   */
  private setOnJob: Map<string, Tensor> | null = null;
  /**
   * Set once the model the sections load from holds trained weights (pull() wrote them into it):
   * the job can no longer be placed again from its start.
   */
  sourceSpent = false;
  /** Which section holds each weight, for the sections as they are (a re-plan may cut them differently). */
  private holders: { of: JobStage[][]; section: Map<string, number> } | null = null;

  constructor(
    private readonly node: Libp2p,
    public jobId: string,
    public plan: Plan,
    public sections: JobStage[][],
    /** What the user holds of the model: where sections come from. */
    readonly source: UserModel,
    /** Where chained results arrive; null: the user relays hidden states between workers. */
    private readonly inbox: ResultInbox | null,
    private readonly options: PlacementOptions,
  ) {}

  /** Whether the job can be planned again: it has a way to place itself, and its source still holds its start. */
  get canReplan(): boolean {
    return this.options.relocate !== null && !this.sourceSpent;
  }

  get all(): JobStage[] {
    return this.sections.flat();
  }

  get assignment(): { peerId: string; start: number; end: number; replica: number }[] {
    return this.all.map(({ where }) => ({ peerId: where.peerId, start: where.start, end: where.end, replica: where.replica }));
  }

  /** Every section of the job with its worker's addresses: what each worker is told. */
  fullAssignment(): StageAssignment[] {
    return this.all.map((s) => s.where);
  }

  /** The chain of generation: replica 0 of every section, in order. */
  route(): JobStage[] {
    return this.sections.map((copies) => copies[0]);
  }

  /** The weights of a section (names and shapes), from the user's source. */
  weightsOf(stage: JobStage): readonly { name: string; shape: number[] }[] {
    return this.source.section([stage.where.start, stage.where.end]).weights;
  }

  /** The weights a section trains (an adapter job's: its factors; the base is frozen), names and shapes. */
  trainedOf(stage: JobStage): readonly { name: string; shape: number[] }[] {
    const all = this.weightsOf(stage);
    return this.source.adapter ? all.filter((w) => isAdapterWeight(w.name)) : all;
  }

  /** The first copy of the section that holds weight `name` now; a typed error for a name no section holds. */
  holderOf(name: string): JobStage {
    if (this.holders?.of !== this.sections) {
      const section = new Map<string, number>();
      this.sections.forEach(([s], i) => this.weightsOf(s).forEach((w) => section.set(w.name, i)));
      this.holders = { of: this.sections, section };
    }
    const i = this.holders.section.get(name);
    if (i === undefined) throw new InvalidArgumentError(`no section of this job holds '${name}'`);
    return this.sections[i][0];
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
    const onProgress = this.options.onProgress ? (p: LoadProgress) => this.options.onProgress!(s, p) : undefined;
    const verifiers = this.options.verifier ? [...this.options.verifier.validatorPeers] : [];
    const format = this.source.format ?? undefined;
    const adapter = this.source.adapter?.wire;
    const base = this.source.adapter?.base;
    const options = {
      upstream: this.upstreamOf(section, s), assignment, onProgress, signal, verifiers,
      ...(format ? { format } : {}), ...(adapter ? { adapter } : {}), ...(base ? { base } : {}),
    };
    let source = this.source.section(range);
    if (this.setOnJob) source = overlaySource(source, this.setOnJob);
    // a copy of a training job's state holds what it trains (an adapter job's: the factors; the frozen base comes from the source)
    if (this.loadFrom) source = overlaySource(source, this.loadFrom);
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
    const old = this.sections[section]?.[replica];
    if (!old) throw new InvalidArgumentError(`the job has no replica ${replica} of section ${section}`);
    // a worker holds one section of a job (jobs are keyed by id): loading a second would replace the first
    if (this.all.some((s) => s.where.peerId === worker.peerId)) {
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
   * Closes every section and places the job again on the workers the validator still trusts
   * (and not in `avoid`), loading the sections from the user's source, or from `weights` (a
   * copy of a training job's state) when given.
   */
  async replan(avoid?: ReadonlySet<string>, weights?: Map<string, Tensor>): Promise<void> {
    if (this.sourceSpent) {
      throw new VerificationError('this job cannot be planned again: pull() wrote the workers\' weights into the model it was distributed from');
    }
    if (!this.options.relocate) throw new InvalidArgumentError('this job was made without a way to place it again: distribute() makes one');
    await Promise.all(this.all.map((s) => (s.remote.open ? s.remote.close() : undefined)));
    const placed = await this.options.relocate(avoid);
    this.jobId = placed.jobId;
    this.plan = placed.plan;
    this.sections = placed.sections;
    this.loadFrom = weights ?? null;
    try {
      await this.load();
    } catch (err) {
      await Promise.all(this.all.map((s) => s.remote.close()));
      throw err;
    } finally {
      this.loadFrom = null;
    }
  }

  /**
   * The hash of the adapter's factors set on the job (`setWeights`) for a section of layers `range` (factorsHash), or
   * undefined when none were: what an audit of its records checks the factors its worker hands over against.
   */
  factorsOf(range: readonly [number, number]): string | undefined {
    if (!this.setOnJob) return undefined;
    const names = this.source.section([range[0], range[1]]).weights.map((w) => w.name).filter(isAdapterWeight);
    if (names.length === 0 || names.some((n) => !this.setOnJob!.has(n))) return undefined;
    return factorsHash(names.map((n) => [n, this.setOnJob!.get(n)!] as const));
  }

  /**
   * Loads every section again with `weights` in place of the weights of the same names (content-addressed: only the
   * chunks a worker lacks move; a base its host holds stays). Later loads (a failover, a re-plan) take them too, those
   * of a failover during this one among them; a load that fails leaves the sections between the two: set them again.
   */
  async setWeights(weights: Map<string, Tensor>): Promise<void> {
    const held = new Map(this.sections.flatMap(([s]) => this.weightsOf(s).map((w) => [w.name, w.shape.join('×')] as const)));
    for (const [name, t] of weights) {
      if (!held.has(name)) throw new InvalidArgumentError(`'${name}' is not a weight this job's workers hold`);
      if (held.get(name) !== t.shape.join('×')) throw new InvalidArgumentError(`'${name}' is [${held.get(name)}] on the workers, not [${t.shape.join('×')}]`);
    }
    // copies: the caller's tensors may change after (a training job's ends go on training)
    this.setOnJob = new Map([...(this.setOnJob ?? []), ...[...weights].map(([n, t]) => [n, t.clone()] as const)]);
    await this.load();
  }

  /** A stage leaves the job (its worker was caught): it is closed and no longer a copy of its section. */
  async exclude(stage: JobStage): Promise<void> {
    for (const copies of this.sections) {
      const i = copies.indexOf(stage);
      if (i >= 0) copies.splice(i, 1);
    }
    await stage.remote.close();
  }

  /** Closes every section's stage (the workers free them). */
  async close(): Promise<void> {
    await Promise.all(this.all.map((s) => s.remote.close()));
  }
}
