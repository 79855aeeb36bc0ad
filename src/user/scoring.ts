import { InvalidArgumentError } from '../errors.ts';
import { countTargets, microBatchLoss, type ModelLayer, runLayers, type TrainingBatch } from '../models/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { FLAGGED_SCORE, scoreContributions } from '../verify/contribution.ts';
import { Reputation, type Standing } from '../verify/reputation.ts';
import type { RemoteTrainStage } from './remote-train.ts';

/**
 * Scored contributions in a running job (Gauntlet, after Templar's validator): in a job whose
 * replicas take local steps (`syncEvery` > 1), before each scheduled average the user scores
 * every replica's change Δ = w − w₀ since the round's anchor w₀, section by section, on a
 * held-out micro-batch the workers never chose nor trained on, with forwards only:
 *
 *   L_before     = the loss with every section at its anchor
 *   L_after(s,r) = the loss with section s at w₀ + ν_s·Δ_{s,r}/‖Δ_{s,r}‖, the others at their anchors
 *
 * `scoreContributions` (src/verify/contribution.ts) turns these into a score per replica in
 * [−2, 2]: the improvement L_before − L_after over the round's largest, plus the cosine of Δ with
 * the other replicas' (ν_s, the median ‖Δ‖ of the section, steps every change at one length, so a
 * replica gains nothing by inflating its change); a zero, non-finite or duplicate change scores
 * FLAGGED_SCORE (−3). That length is also why the score alone cannot see a replica that sends a
 * scaled change (to weigh more in the average). So a replica whose ‖Δ‖ is more than
 * `maxNormRatio` times the median of the others' that scored at or above the floor this round,
 * and whose largest |Δ| is more than `maxStepRatio` times the sum of the round's learning rates
 * (AdamW moves a weight about lr a step at most), scores FLAGGED_SCORE for the round too: both,
 * so that an honest replica's noisy length alone never counts against it. Each round's value
 * goes to `Reputation.score`: a replica is excluded only once it has scored below the floor in
 * `rounds` rounds net of its good ones (default 2), so one unlucky round never excludes an
 * honest replica.
 *
 * Cost per round, for S sections of R replicas: 1 + S·R forwards of one micro-batch
 * through every section, and each replica's Δ fetched by the user (the bytes of one dense
 * average of its section).
 */
export interface ScoreOptions {
  /**
   * The held-out micro-batch of the round that ends with step `step` (1, 2, …; the same in a
   * replay): drawn by the user from data no step trains on, so the workers cannot know it.
   */
  batch: (step: number) => TrainingBatch;
  /** A round's value below this counts against a replica (default SCORE_FLOOR). */
  floor?: number;
  /** Rounds below the floor, net of good ones, that exclude a replica (default 2). */
  rounds?: number;
  /** A change longer than this many times the median of the others' may be scaled (default MAX_NORM_RATIO). */
  maxNormRatio?: number;
  /** … and is, when its largest |Δ| is also more than this many times the round's learning rates added up (default MAX_STEP_RATIO). */
  maxStepRatio?: number;
  /** Told after every round (figures, progress). */
  onRound?: (report: RoundReport) => void;
}

/**
 * The floor of a round's value. An honest replica's score is its improvement over the round's
 * largest, in [−1, 1], plus its cosine with the others' changes: once the loss has flattened, a
 * held-out micro-batch cannot tell honest changes apart and the first term is noise (−1 is
 * common), while the cosine stays about ≥ −0.1, so honest scores stay near or above −1 (the worst
 * of 600 measured: −1.10, README); a zero, copied, non-finite or scaled change scores −3. The
 * floor sits between.
 */
export const SCORE_FLOOR = -1.5;

/**
 * Largest ‖Δ‖ over the median of the other replicas' in a round an honest replica may have. Honest
 * replicas of a section step with the same AdamW at the same rate on as many micro-batches, but
 * on 1 micro-batch a step their changes' lengths differ: 0.63–1.58 over 480 measured rounds of
 * two honest replicas, against 1.65–3.15 for a replica that sends twice its change (`--fault
 * scale-grad`); the bound is about their geometric mean (README).
 */
export const MAX_NORM_RATIO = 1.6;

/**
 * Largest max |Δ| / Σ lr an honest replica may have: bias-corrected AdamW moves a weight at most
 * about lr a step (exactly lr for a gradient of constant sign), plus weight decay. Measured:
 * honest 0.37–1.12, twice the change 1.32–2.01; the bound is about their geometric mean.
 */
export const MAX_STEP_RATIO = 1.2;

/** One replica of one section in one round. */
export interface ReplicaRound {
  section: number;
  replica: number;
  peer: string;
  /** `scoreContributions`' score and its parts. */
  score: number;
  improvement: number;
  agreement: number;
  /** ‖Δ‖, and over the median of the others' that scored at or above the floor (null: none did). */
  norm: number;
  normRatio: number | null;
  /** max |Δ| over the sum of the round's learning rates. */
  stepRatio: number;
  /** What went to its reputation: the score, or FLAGGED_SCORE for a scaled change. */
  value: number;
  standing: Standing;
}

export interface RoundReport {
  /** The step the round ended with (its average follows it). */
  step: number;
  lossBefore: number;
  replicas: ReplicaRound[];
  /** Peers excluded by this round. */
  excluded: string[];
}

/** The user's own layers of a job that keeps its ends (privacy 'ends'), for the held-out pass. */
export interface UserEndLayers {
  first: readonly ModelLayer[];
  last: readonly ModelLayer[];
  maxPositions: number;
}

function squaredNorm(delta: Map<string, Float32Array>): number {
  let s = 0;
  for (const d of delta.values()) for (let i = 0; i < d.length; i++) s += d[i] * d[i];
  return s;
}

function maxAbs(delta: Map<string, Float32Array>): number {
  let m = 0;
  for (const d of delta.values()) for (let i = 0; i < d.length; i++) m = Math.max(m, Math.abs(d[i]));
  return m;
}

function median(values: number[]): number | undefined {
  if (values.length === 0) return undefined;
  const v = [...values].sort((x, y) => x - y);
  const m = v.length >> 1;
  return v.length % 2 === 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

/** Scores a job's replicas round by round (see ScoreOptions) and keeps their standing. */
export class ReplicaScorer {
  readonly reputation = new Reputation();
  readonly reports: RoundReport[] = [];
  readonly floor: number;
  readonly rounds: number;
  readonly maxNormRatio: number;
  readonly maxStepRatio: number;

  constructor(
    private readonly options: ScoreOptions,
    /** The user's ends (null: the workers hold them, the first section takes token ids and the last returns logits). */
    private readonly ends: UserEndLayers | null,
  ) {
    this.floor = options.floor ?? SCORE_FLOOR;
    this.rounds = options.rounds ?? 2;
    this.maxNormRatio = options.maxNormRatio ?? MAX_NORM_RATIO;
    this.maxStepRatio = options.maxStepRatio ?? MAX_STEP_RATIO;
    if (!(this.maxNormRatio > 1)) throw new InvalidArgumentError(`maxNormRatio must be > 1, got ${this.maxNormRatio}`);
    if (!(this.maxStepRatio > 0)) throw new InvalidArgumentError(`maxStepRatio must be > 0, got ${this.maxStepRatio}`);
  }

  /**
   * The held-out loss with section `at.section` at replica `at.replica`'s anchor + scale·Δ and
   * every other section at its anchor (`at` null: all at their anchors).
   */
  private async pass(
    sections: RemoteTrainStage[][],
    batch: TrainingBatch,
    at: { section: number; replica: number; scale: number } | null,
  ): Promise<number> {
    const ends = this.ends;
    let x: Tensor = ends ? noGrad(() => runLayers(ends.first, batch.input, {}, ends.maxPositions)) : batch.input;
    for (let s = 0; s < sections.length; s++) {
      x = at?.section === s ? await sections[s][at.replica].trialForward(x, 'current', at.scale) : await sections[s][0].trialForward(x, 'anchor');
    }
    const logits = ends ? noGrad(() => runLayers(ends.last, x, {}, ends.maxPositions)) : x;
    return noGrad(() => microBatchLoss(logits, batch.target, countTargets(batch.target)).item());
  }

  /**
   * Scores the round that ended with step `step` in `sections` (each section's replicas, in the pipeline's order): every
   * replica's change, fetched, scored and added to its reputation. Call it before the average.
   */
  async round(sections: RemoteTrainStage[][], step: number, lrSum: number): Promise<RoundReport> {
    const batch = this.options.batch(step);
    const lossBefore = await this.pass(sections, batch, null);
    const replicas: ReplicaRound[] = [];
    const excluded: string[] = [];
    for (let s = 0; s < sections.length; s++) {
      const lanes = sections[s];
      if (lanes.length < 2) continue;
      const deltas = await Promise.all(lanes.map((h) => h.trialDelta()));
      const entries = deltas.map((grads, r) => ({ peer: lanes[r].peerId, grads }));
      // scoreContributions asks for its losses synchronously: a first call names the steps it takes, the passes run, a second scores
      const asked = new Map<number, number>();
      scoreContributions(entries, lossBefore, (_g, r, factor) => {
        asked.set(r, factor);
        return lossBefore;
      });
      const losses = new Map<number, number>();
      for (const [r, factor] of asked) losses.set(r, await this.pass(sections, batch, { section: s, replica: r, scale: factor }));
      const scores = scoreContributions(entries, lossBefore, (_g, r) => losses.get(r)!);
      const norms = deltas.map((d) => Math.sqrt(squaredNorm(d)));
      const steps = deltas.map((d) => maxAbs(d) / lrSum);
      scores.forEach((sc, r) => {
        const others = norms.filter((_, j) => j !== r && scores[j].score >= this.floor && scores[j].score !== FLAGGED_SCORE);
        const ref = median(others);
        const normRatio = ref === undefined || ref === 0 ? null : norms[r] / ref;
        const scaled = normRatio !== null && normRatio > this.maxNormRatio && steps[r] > this.maxStepRatio;
        const value = scaled ? FLAGGED_SCORE : sc.score;
        const was = this.reputation.excluded(sc.peer);
        const reason = scaled
          ? `its change was ${normRatio!.toFixed(2)}× the other replicas' and moved a weight ${steps[r].toFixed(2)}× the learning rate (more than ${this.maxNormRatio}× and ${this.maxStepRatio}×)`
          : `its change scored below ${this.floor} on held-out data in ${this.rounds} rounds`;
        const standing = this.reputation.score(sc.peer, value, { floor: this.floor, rounds: this.rounds }, reason);
        if (standing.excluded && !was) excluded.push(sc.peer);
        const { peer, score, improvement, agreement } = sc;
        const [norm, stepRatio] = [norms[r], steps[r]];
        replicas.push({ section: s, replica: r, peer, score, improvement, agreement, norm, normRatio, stepRatio, value, standing });
      });
    }
    const report = { step, lossBefore, replicas, excluded };
    this.reports.push(report);
    this.options.onRound?.(report);
    return report;
  }
}
