import { InvalidArgumentError, StageFailedError, TensorLinkError, VerificationError } from '../errors.ts';
import { clipScale, type LrLambda } from '../nn/index.ts';
import { countTargets, microBatchLoss, splitBatch, type StepResult, type TrainingBatch, trainingSchedule } from '../models/index.ts';
import { type Activation, isPassed, type StageHandle } from './handle.ts';
import { type Action, gpipeActions, type ScheduleName, stageActions } from './schedule.ts';

/**
 * One stage of a pipeline: its replicas (micro-batch k goes to replica k mod r), and how it
 * orders its work. 'schedule' follows the trainer's schedule; the user's own ends use
 * 'forwards-first' (the first: all forwards, then backwards as gradients come) and
 * 'one-by-one' (the last: each forward followed by its backward), which never hold a worker up.
 */
export interface PipelineStage {
  replicas: StageHandle[];
  order?: 'schedule' | 'forwards-first' | 'one-by-one';
}

export interface PipelineTrainerOptions {
  lr: number;
  /** Steps the learning-rate schedule spans (warm-up, then cosine to 10%). */
  totalSteps: number;
  warmupSteps?: number;
  /** Clip the global gradient norm, over every stage, to this (default 1; 0 disables). */
  clipNorm?: number;
  microBatches: number;
  schedule?: ScheduleName;
  /**
   * Local steps (DiLoCo; Templar's SparseLoCo): the replicas of a stage step on their own
   * micro-batches' gradients, and every `syncEvery` steps (and at the schedule's last step)
   * average how far their weights moved, through the job's gradient codec. Default 1: the
   * replicas' gradients are summed every step, exactly as one process.
   */
  syncEvery?: number;
  /**
   * Replicas reduce every micro-batch's contribution in the batch's order (the holders keep them: keepMicros), so that
   * their steps are one process's bit for bit; each holder then sends its micro-batches' gradients rather than their
   * sum (microBatches / replicas times the bytes: for small trained parts, as adapters). Default false: each replica's
   * sum, added in replica order (within float rounding of one process).
   */
  orderedReplicas?: boolean;
}

export interface PipelineStepResult extends StepResult {
  /** Wall time of the step, seconds. */
  seconds: number;
  /** Seconds each stage's replicas spent on forwards and backwards (as seen from this side: compute and transfer). */
  busy: number[][];
}

/** Rejections of a holder's work become the StageFailedError that blames it. */
type Guard = <T>(h: StageHandle, work: Promise<T>) => Promise<T>;

/** A step's gradient norm, and the clipping scale each holder steps with. */
interface Norms {
  gradNorm: number;
  scaleOf: (stage: PipelineStage, holder: StageHandle) => number;
}

type Deferred<T> = { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void };

function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  const d = { promise, resolve, reject };
  d.promise.catch(() => {}); // a step that fails rejects every pending hand-over; the error is reported once
  return d;
}

/**
 * Trains a model split into stages: for each step it splits the batch into micro-batches,
 * runs the schedule (activations forward, gradients of activations backward), computes the
 * loss at the user's end, reduces the gradients of replicas and tied weights among their
 * holders, clips by the global norm over all stages and has every stage take its optimizer step.
 * Losses, gradients and weights equal one process training with the same micro-batches.
 */
export class PipelineTrainer {
  stepCount = 0;
  /** Whether replicas take local steps (and average every `syncEvery`) rather than summing gradients each step. */
  readonly local: boolean;
  /** Averages of local steps taken: each one's messages go under a key of its own. */
  private averages = 0;
  /** Steps taken since the last average (local steps). */
  private unaveraged = 0;
  /**
   * Runs after a step's last backward and before its flush (reductions, clipping, optimizer
   * steps); a rejection fails the step as a failed stage does. A verifier settles the previous
   * step's checks here, while the workers still keep what re-running them needs.
   */
  beforeFlush: (() => Promise<void>) | null = null;
  /**
   * Local steps: runs before each average the schedule takes (not one `sync` asks for), with
   * the step it follows (1, 2, …: the same in a replay) and the learning rates of the steps
   * since the last average, while every replica still holds its own change: the job's
   * scorer scores them here. A rejection fails the step after its optimizer steps (the job is
   * rolled back).
   */
  beforeAverage: ((step: number, lrs: readonly number[]) => Promise<void>) | null = null;
  /** The learning rates of the steps since the last average, in order: how far AdamW can have moved a weight since. */
  private lrs: number[] = [];
  private readonly lambda: LrLambda;
  /** Parameters with the same holders; `replicas`: the holders are replicas of one stage (not a tie across stages). */
  private readonly groups: { names: string[]; holders: StageHandle[]; replicas: boolean }[];
  /** Every parameter name once, in stage order: the model's order. */
  private readonly order: string[];

  constructor(
    readonly stages: PipelineStage[],
    private readonly options: PipelineTrainerOptions,
  ) {
    if (stages.length === 0 || stages.some((s) => s.replicas.length === 0)) throw new InvalidArgumentError('every stage needs a replica');
    if (!Number.isInteger(options.microBatches) || options.microBatches < 1) {
      throw new InvalidArgumentError(`micro-batches must be ≥ 1, got ${options.microBatches}`);
    }
    for (const s of stages) {
      if (s.replicas.length > options.microBatches) {
        throw new InvalidArgumentError(`${s.replicas.length} replicas need at least as many micro-batches (got ${options.microBatches})`);
      }
    }
    const every = options.syncEvery ?? 1;
    if (!Number.isInteger(every) || every < 1) throw new InvalidArgumentError(`syncEvery must be an integer ≥ 1, got ${every}`);
    this.lambda = trainingSchedule(options);
    // the holders of every parameter, grouped: parameters with the same holders reduce together
    const holders = new Map<string, StageHandle[]>();
    for (const s of stages) for (const h of s.replicas) for (const n of h.names) holders.set(n, [...(holders.get(n) ?? []), h]);
    const groups = new Map<string, { names: string[]; holders: StageHandle[]; replicas: boolean }>();
    for (const [name, hs] of holders) {
      const key = hs.map((h) => h.address).join(' ');
      const replicas = hs.length > 1 && stages.some((st) => hs.every((h) => st.replicas.includes(h)));
      const g = groups.get(key) ?? { names: [], holders: hs, replicas };
      g.names.push(name);
      groups.set(key, g);
    }
    this.groups = [...groups.values()];
    this.order = [...holders.keys()];
    this.local = every > 1 && this.groups.some((g) => g.replicas);
    if (this.local) {
      // replica j of every stage trains on micro-batches k mod r = j, and clips by their norm: one r for all
      const counts = new Set(stages.filter((st) => st.replicas.length > 1).map((st) => st.replicas.length));
      if (counts.size > 1) throw new InvalidArgumentError(`local steps need the same number of replicas in every replicated stage, got ${[...counts].join(' and ')}`);
      // a tie summed every step between stages with replicas would step apart by each replica's own clipping
      const replicated = (h: StageHandle) => stages.some((st) => st.replicas.length > 1 && st.replicas.includes(h));
      const tie = this.groups.find((g) => !g.replicas && g.holders.length > 1 && g.holders.some(replicated));
      if (tie) {
        throw new InvalidArgumentError(`local steps do not support '${tie.names[0]}' tied across replicated stages on workers: keep the ends with the user (privacy 'ends')`);
      }
    }
  }

  /** The learning rate the next step uses. */
  get lr(): number {
    return this.options.lr * this.lambda(this.stepCount);
  }

  /** The micro-batches a replica runs in a step of `m`: k with k mod replicas = its place among its stage's replicas. */
  private microsOf(h: StageHandle, m: number): number[] {
    const stage = this.stages.find((st) => st.replicas.includes(h))!;
    const j = stage.replicas.indexOf(h);
    return Array.from({ length: m }, (_, k) => k).filter((k) => k % stage.replicas.length === j);
  }

  /** The actions of replica `j` of stage `s` for this step. */
  private actions(s: number, j: number): Action[] {
    const stage = this.stages[s];
    const m = this.options.microBatches;
    const micros = Array.from({ length: m }, (_, k) => k).filter((k) => k % stage.replicas.length === j);
    const order = stage.order ?? 'schedule';
    if (order === 'forwards-first') return gpipeActions(micros);
    if (order === 'one-by-one') return micros.flatMap((micro): Action[] => [{ op: 'F', micro }, { op: 'B', micro }]);
    const scheduled = this.stages.map((x, i) => ({ x, i })).filter(({ x }) => (x.order ?? 'schedule') === 'schedule');
    const position = scheduled.findIndex(({ i }) => i === s);
    return stageActions(this.options.schedule ?? '1f1b', micros, position, scheduled.length);
  }

  async step(batch: TrainingBatch): Promise<PipelineStepResult> {
    const started = performance.now();
    const m = this.options.microBatches;
    const parts = splitBatch(batch, m);
    const tokens = countTargets(batch.target);
    const lr = this.lr;
    const p = this.stages.length;
    const inputs = this.stages.map(() => parts.map(() => deferred<Activation>()));
    const grads = this.stages.map(() => parts.map(() => deferred<Activation>()));
    parts.forEach((part, k) => inputs[0][k].resolve(part.input));
    const losses = new Array<number>(m).fill(0);
    const busy = this.stages.map((s) => s.replicas.map(() => 0));
    let failed: unknown = null;
    const failAll = (err: unknown) => {
      failed ??= err;
      for (const list of [...inputs, ...grads]) for (const d of list) d.reject(err);
    };
    const blame = (s: number, h: StageHandle, err: unknown, neighbour?: number, micro = 0): StageFailedError => {
      if (err instanceof StageFailedError) return err;
      // a worker that could not pass its result on names the neighbour: that stage failed
      const about = err instanceof TensorLinkError ? err.details?.about : undefined;
      const other = neighbour === undefined ? undefined : this.stages[neighbour]?.replicas[micro % this.stages[neighbour].replicas.length];
      if (other && about !== undefined && about === other.direct) return blame(neighbour!, other, err);
      const text = err instanceof Error ? err.message : String(err);
      return new StageFailedError(`stage ${s} (${h.label}) failed: ${text}`, {
        details: { stage: s, worker: h.label, error: err instanceof TensorLinkError ? err.name : 'Error' },
        cause: err,
      });
    };
    // where micro-batch k's tensors go from stage s: straight to the neighbour's worker when both are workers that take them
    const neighbour = (s: number, k: number) => this.stages[s]?.replicas[k % this.stages[s].replicas.length]?.direct;
    const to = (h: StageHandle, s: number, k: number) => (h.direct ? neighbour(s, k) : undefined);
    const lossAt = (k: number, logits: Activation) => {
      if (isPassed(logits)) throw new InvalidArgumentError(`the last stage passed micro-batch ${k}'s output on instead of returning it`);
      const leaf = logits.detach();
      leaf.requiresGrad = true;
      const loss = microBatchLoss(leaf, parts[k].target, tokens, parts[k].objective);
      loss.backward();
      losses[k] = loss.item();
      grads[p - 1][k].resolve(leaf.grad!);
    };
    const run = async (s: number, j: number) => {
      const h = this.stages[s].replicas[j];
      for (const a of this.actions(s, j)) {
        if (failed) return;
        if (a.op === 'F') {
          const x = await inputs[s][a.micro].promise;
          const t0 = performance.now();
          const y = await h.forward(a.micro, x, to(h, s + 1, a.micro))
            .catch((err: unknown) => Promise.reject(blame(s, h, err, s + 1, a.micro)));
          busy[s][j] += (performance.now() - t0) / 1000;
          if (s === p - 1) lossAt(a.micro, y);
          else inputs[s + 1][a.micro].resolve(y);
        } else {
          const g = await grads[s][a.micro].promise;
          const t0 = performance.now();
          const gi = await h.backward(a.micro, g, to(h, s - 1, a.micro))
            .catch((err: unknown) => Promise.reject(blame(s, h, err, s - 1, a.micro)));
          busy[s][j] += (performance.now() - t0) / 1000;
          if (s > 0) grads[s - 1][a.micro].resolve(gi!);
        }
      }
    };
    const loops = this.stages.flatMap((stage, s) => stage.replicas.map((_, j) => run(s, j).catch((err: unknown) => failAll(err))));
    await Promise.all(loops);
    if (!failed && this.beforeFlush) {
      try {
        await this.beforeFlush();
      } catch (err) {
        failed = err;
      }
    }
    if (failed) {
      await Promise.all(this.stages.flatMap((st) => st.replicas.map((h) => h.reset().catch(() => {}))));
      throw failed;
    }
    // the flush: reduce shared parameters, clip by the global norm, step everywhere
    const atStage = (h: StageHandle) => this.stages.findIndex((st) => st.replicas.includes(h));
    const guard = <T>(h: StageHandle, work: Promise<T>) => work.catch((err: unknown) => Promise.reject(blame(atStage(h), h, err)));
    // with local steps, replicas keep their own gradients: only a tie across stages is summed
    const local = this.local;
    await Promise.all(
      this.groups
        .map((g, gi) => ({ g, gi }))
        .filter(({ g }) => g.holders.length > 1 && !(local && g.replicas))
        .flatMap(({ g, gi }) => {
          const micros = this.options.orderedReplicas && g.replicas ? { micros: g.holders.map((h) => this.microsOf(h, m)) } : {};
          return g.holders.map((h, index) =>
            guard(h, h.reduce({ key: `${this.stepCount}:${gi}`, names: g.names, peers: g.holders.map((x) => x.address), index, ...micros })));
        }),
    );
    const clip = this.options.clipNorm ?? 1;
    const { gradNorm, scaleOf } = local ? await this.localNorms(guard, clip) : await this.globalNorm(guard, clip);
    await Promise.all(this.stages.flatMap((st) => st.replicas.map((h) => guard(h, h.step(scaleOf(st, h), lr)))));
    const every = this.options.syncEvery ?? 1;
    this.unaveraged++;
    this.lrs.push(lr);
    if (local && ((this.stepCount + 1) % every === 0 || this.stepCount + 1 === this.options.totalSteps)) {
      if (this.beforeAverage) await this.beforeAverage(this.stepCount + 1, this.lrs);
      await this.average(guard);
    }
    this.stepCount++;
    let loss = 0;
    for (const l of losses) loss += l;
    return { loss, gradNorm: clip > 0 ? gradNorm : Number.NaN, lr, tokens, seconds: (performance.now() - started) / 1000, busy };
  }

  /** ‖g‖² per parameter from its first holder, added up in the model's order (as one process does): one clipping scale for all. */
  private async globalNorm(guard: Guard, clip: number): Promise<Norms> {
    const squares = new Map<string, number>();
    await Promise.all(this.groups.map(async (g) => {
      const values = await guard(g.holders[0], g.holders[0].gradSquares(g.names));
      g.names.forEach((n, i) => squares.set(n, values[i]));
    }));
    let total = 0;
    for (const n of this.order) total += squares.get(n)!;
    const gradNorm = Math.sqrt(total);
    const scale = clip > 0 ? clipScale(gradNorm, clip) : 1;
    return { gradNorm, scaleOf: () => scale };
  }

  /**
   * Local steps: replica j of every stage trains on the same micro-batches (k mod r = j), and
   * clips as a trainer of its own would: by the norm of its own gradients (which cover 1/r of
   * the batch, so they count r² times) with the shared parameters' (the user's ends). The
   * shared parameters clip by the norm with the replicas' mean; that is the step's `gradNorm`.
   */
  private async localNorms(guard: Guard, clip: number): Promise<Norms> {
    // every holder's ‖g‖² per group, asked at once and added in the groups' order (the same every run)
    const answers = await Promise.all(this.groups.map((g) => Promise.all((g.replicas ? g.holders : g.holders.slice(0, 1))
      .map(async (h) => (await guard(h, h.gradSquares(g.names))).reduce((a, b) => a + b, 0)))));
    let shared = 0;
    const own: number[] = [];
    this.groups.forEach((g, gi) => {
      if (!g.replicas) shared += answers[gi][0];
      else answers[gi].forEach((q, j) => (own[j] = (own[j] ?? 0) + g.holders.length ** 2 * q));
    });
    const mean = own.length === 0 ? 0 : own.reduce((a, b) => a + b, 0) / own.length;
    const gradNorm = Math.sqrt(shared + mean);
    const scale = (norm: number) => (clip > 0 ? clipScale(norm, clip) : 1);
    const sharedScale = scale(gradNorm);
    const scales = own.map((q) => scale(Math.sqrt(shared + q)));
    return {
      gradNorm,
      scaleOf: (st, h) => (st.replicas.length > 1 ? scales[st.replicas.indexOf(h)] ?? sharedScale : sharedScale),
    };
  }

  /**
   * Averages the replicas' local steps now, between steps (before an evaluation or a checkpoint,
   * so that they see the replicas' average rather than one replica's weights); nothing without
   * local steps or when no step was taken since the last average.
   */
  async sync(): Promise<void> {
    if (this.local && this.unaveraged > 0) await this.average((_h, work) => work);
  }

  /**
   * Averages every replica group's weights' changes since the last average (local steps). Every
   * holder of a group must then hold the same weights: a worker that names others is a
   * VerificationError (one of them did not average what the others sent).
   */
  private async average(guard: Guard): Promise<void> {
    const round = this.averages++;
    await Promise.all(this.groups.map(async (g, gi) => {
      if (!g.replicas) return;
      const peers = g.holders.map((x) => x.address);
      const hashes = await Promise.all(g.holders.map((h, index) => {
        if (!h.sync) throw new InvalidArgumentError(`${h.label} cannot average local steps`);
        return guard(h, h.sync({ key: `sync:${round}:${gi}`, names: g.names, peers, index }));
      }));
      const named = hashes.filter((x): x is string => x !== null);
      if (named.some((x) => x !== named[0])) {
        const list = g.holders.map((h, i) => `${h.label}: ${hashes[i]?.slice(0, 12) ?? 'this process'}`).join('; ');
        throw new VerificationError(`the replicas of ${g.names[0]}… hold different weights after averaging their local steps (${list})`, {
          details: { holders: g.holders.map((h) => h.label) },
        });
      }
    }));
    this.unaveraged = 0;
    this.lrs = [];
  }

  /** Moves the learning-rate schedule to `step` (resuming a job). */
  fastForward(step: number): void {
    this.stepCount = step;
  }
}
