import { InvalidArgumentError } from '../errors.ts';
import { countTargets, microBatchLoss, type ModelLayer, runLayers, type TrainingBatch } from '../models/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { FLAGGED_SCORE, median, scoreContributions } from '../verify/contribution.ts';
import { Reputation, type Standing } from '../verify/reputation.ts';
import { CaughtError } from './job-trainer.ts';
import type { RemoteTrainStage } from './remote-train.ts';
import type { JobVerifier } from './verifier.ts';

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
 * scaled change (to weigh more in the average). AdamW bounds how far an honest replica can move
 * any weight: |Δw| ≤ Σ_t lr_t·(adamStepBound(t) + weightDecay·maxWeight) over the round's steps
 * t, whatever its gradients (see adamStepBound). A replica whose largest |Δ| passes that bound
 * (`stepRatio` > 1) scores FLAGGED_SCORE for the round: no honest AdamW trajectory gets there.
 * Each round's value goes to `Reputation.score`: a replica is excluded only once it has scored
 * below the floor in `rounds` rounds net of its good ones (default 2), so one unlucky round
 * never excludes an honest replica.
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
  /** The largest |w| of a matrix the job trains (weight decay moves a weight by lr·decay·|w| a step; default MAX_WEIGHT). */
  maxWeight?: number;
  /** Told after every round (figures, progress). */
  onRound?: (report: RoundReport) => void;
}

/**
 * The floor of a round's value: −2, the lowest score a change that is not flagged can get, so
 * that only flagged rounds (−3: a zero, copied or non-finite change, or one past AdamW's reach)
 * count against a replica. An honest replica's score is its improvement over the round's largest,
 * in [−1, 1], plus its cosine with the others' changes. Once the loss has flattened, a held-out
 * micro-batch of a few windows cannot tell changes apart and the first term is noise: honest
 * scores went to −1.15 in honest jobs and to −1.56 beside a cheater left in the job (README), so
 * no floor above −2 keeps them all. The scores still go into the moving average `Standing.rounds`.
 */
export const SCORE_FLOOR = -2;

/** The largest |w| assumed of a trained matrix's entries (weights of a few hundredths to a few tenths are usual). */
export const MAX_WEIGHT = 2;

/** AdamW's betas (the job's optimizer keeps the defaults). */
const BETAS = [0.9, 0.999] as const;

/**
 * The largest |m̂_t/√v̂_t| bias-corrected Adam can reach at its step t, for any gradients: by
 * Cauchy–Schwarz, |m_t| ≤ (1−β₁)·√(Σ_{k<t} (β₁²/β₂)^k)·√(v_t/(1−β₂)), and the bias corrections
 * multiply it by √(1−β₂^t)/(1−β₁^t). 1 at t = 1 (the first step is lr·sign(g)), about 1.01 up to
 * t = 8, 1.16 at t = 20, 1.46 at 40, 2.0 at 80, 5.8 at 1,000. ε only makes the step shorter.
 *
 * @example
 * adamStepBound(1) // 1 (up to rounding): the first step is lr·sign(g)
 */
export function adamStepBound(t: number, [b1, b2]: readonly [number, number] = BETAS): number {
  if (!Number.isInteger(t) || t < 1) throw new InvalidArgumentError(`an Adam step count is an integer ≥ 1, got ${t}`);
  const q = (b1 * b1) / b2;
  const sum = q === 1 ? t : (1 - q ** t) / (1 - q);
  return ((1 - b1) / Math.sqrt(1 - b2)) * Math.sqrt(sum) * (Math.sqrt(1 - b2 ** t) / (1 - b1 ** t));
}

/** One replica of one section in one round. */
export interface ReplicaRound {
  section: number;
  replica: number;
  peer: string;
  /** `scoreContributions`' score and its parts. */
  score: number;
  improvement: number;
  agreement: number;
  /** ‖Δ‖, and over the median of the other replicas' (null: none is non-zero); for the record, not decisive. */
  norm: number;
  normRatio: number | null;
  /** max |Δ| over the most honest AdamW could have moved a weight this round: above 1, the change was not AdamW's. */
  stepRatio: number;
  /** What went to its reputation: the score, or FLAGGED_SCORE for a change past the bound. */
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

/** AdamW's weight decay of matrices when the job gives none (trainingOptimizer's). */
const DEFAULT_MATRIX_DECAY = 0.1;

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

/** Scores a job's replicas round by round (see ScoreOptions) and keeps their standing. */
export class ReplicaScorer {
  readonly reputation = new Reputation();
  readonly reports: RoundReport[] = [];
  readonly floor: number;
  readonly rounds: number;
  readonly maxWeight: number;

  constructor(
    private readonly options: ScoreOptions,
    /** The user's ends (null: the workers hold them, the first section takes token ids and the last returns logits). */
    private readonly ends: UserEndLayers | null,
    /** The job's AdamW weight decay of matrices (the optimizer's default when not given). */
    private readonly weightDecay = DEFAULT_MATRIX_DECAY,
  ) {
    this.floor = options.floor ?? SCORE_FLOOR;
    this.rounds = options.rounds ?? 2;
    this.maxWeight = options.maxWeight ?? MAX_WEIGHT;
    if (!(this.maxWeight >= 0)) throw new InvalidArgumentError(`maxWeight must be ≥ 0, got ${this.maxWeight}`);
  }

  /** The most honest AdamW moves a weight in a round of steps ending at `step` (1-based) at learning rates `lrs`. */
  private stepBound(step: number, lrs: readonly number[]): number {
    const first = step - lrs.length + 1;
    return lrs.reduce((sum, lr, j) => sum + lr * (adamStepBound(first + j) + this.weightDecay * this.maxWeight), 0);
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
    return noGrad(() => microBatchLoss(logits, batch.target, countTargets(batch.target), batch.objective).item());
  }

  /**
   * What a job runs before each average (PipelineTrainer.beforeAverage): a round over its replicas; the replicas it
   * excludes leave the job (flagged by its verifier) and a CaughtError has the job rolled back and replayed without them.
   */
  beforeAverage(sections: RemoteTrainStage[][], verifier: JobVerifier): (step: number, lrs: readonly number[]) => Promise<void> {
    return async (step, lrs) => {
      const { excluded } = await this.round(sections, step, lrs);
      if (excluded.length === 0) return;
      for (const peer of excluded) {
        verifier.excluded.add(peer);
        if (!verifier.summary.flagged.includes(peer)) verifier.summary.flagged.push(peer);
      }
      throw new CaughtError(excluded.map((peer) => ({ ok: false, peer, reason: this.reputation.standing(peer).reason ?? 'scored out' })));
    };
  }

  /**
   * Scores the round of steps at learning rates `lrs` that ended with step `step`, in `sections`
   * (each section's replicas, in the pipeline's order): every replica's change, fetched, scored
   * and added to its reputation. Call it before the average.
   */
  async round(sections: RemoteTrainStage[][], step: number, lrs: readonly number[]): Promise<RoundReport> {
    const bound = this.stepBound(step, lrs);
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
      const steps = deltas.map((d) => maxAbs(d) / bound);
      scores.forEach((sc, r) => {
        const ref = median(norms.filter((_, j) => j !== r));
        const normRatio = ref === undefined || ref === 0 ? null : norms[r] / ref;
        const scaled = steps[r] > 1;
        const value = scaled ? FLAGGED_SCORE : sc.score;
        const was = this.reputation.excluded(sc.peer);
        const reason = scaled
          ? `its change moved a weight ${steps[r].toFixed(2)}× as far as AdamW can in a round`
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
