import { InvalidMessageError } from '../../errors.ts';
import { expectTensors, fromWire, parseName } from '../../p2p/index.ts';
import { runLayers } from '../../models/index.ts';
import { noGrad, type Tensor, tensor } from '../../tensor/index.ts';
import type { FaultInjector } from '../fault.ts';
import type { Training } from '../jobs.ts';
import { sectionOf, type StageHandler, trainingOf } from './types.ts';

/**
 * Scoring a replica's local steps (Gauntlet, see src/user/scoring.ts): before an average, the
 * job's owner asks each replica for its weights' change since the anchor (`trial-delta`) and
 * runs a held-out micro-batch through the sections with forwards only (`trial-forward`), each
 * section at the anchor or at anchor + scale·(its change). Nothing here is trained or recorded.
 *
 * The anchor is this module's own copy of the weights the round started from (taken at setup
 * and after every average): GradientExchange keeps its own privately.
 */
interface TrialState {
  anchor: Map<string, Float32Array>;
  /** Whether this round's change has been fixed: a faulty worker alters it once, before it is shown or sent. */
  fixed: boolean;
}

const states = new WeakMap<Training, TrialState>();

/** Takes the weights the next round's change is measured from (setup with local steps, and after each average). */
export function takeTrialAnchor(training: Training): void {
  const anchor = new Map([...training.executor.named].map(([n, p]) => [n, (p.data as Float32Array).slice()]));
  states.set(training, { anchor, fixed: false });
}

function stateOf(training: Training): TrialState {
  const state = states.get(training);
  if (!state) throw new InvalidMessageError('this section takes no local steps (train-setup without syncEvery): it has no change to score');
  return state;
}

/**
 * Fixes this round's change before anything shows or sends it: a worker with `--fault scale-grad`
 * sends twice its change, one with `free-ride` none (its weights go back to the anchor). Under
 * AdamW, doubling the gradients hardly moves the weights (the update is invariant to their
 * scale, and clipping halves them back), so in a job with local steps the fault is applied to
 * what the worker sends: the change that weighs in the average.
 */
export function fixChange(training: Training, fault: FaultInjector | null): void {
  const state = states.get(training);
  if (!state || state.fixed) return;
  state.fixed = true;
  if (!fault) return;
  const { executor } = training;
  const changes = new Map([...executor.named].map(([n, p]) => {
    const a = state.anchor.get(n)!;
    return [n, tensor((p.data as Float32Array).map((v, i) => v - a[i]), p.shape)] as const;
  }));
  const before = fault.cheated;
  fault.contribution(changes);
  if (fault.cheated === before) return;
  for (const [n, p] of executor.named) {
    const a = state.anchor.get(n)!;
    const c = changes.get(n)!.data as Float32Array;
    (p.data as Float32Array).set(a.map((v, i) => Math.fround(v + c[i])));
  }
  executor.weightsChanged();
  training.records.invalidate();
}

/** A trial forward's body: the weights it runs at ('anchor', or 'current': anchor + scale·change). */
export function parseTrialForward(body: Record<string, unknown>): { weights: 'anchor' | 'current'; scale: number } {
  const { weights } = body;
  if (weights !== 'anchor' && weights !== 'current') throw new InvalidMessageError(`trial-forward: weights must be 'anchor' or 'current', got ${JSON.stringify(weights)}`);
  const scale = body.scale ?? 1;
  if (typeof scale !== 'number' || !Number.isFinite(scale) || scale < 0) throw new InvalidMessageError(`trial-forward: scale must be a finite number ≥ 0, got ${String(scale)}`);
  return { weights, scale };
}

/** Runs `fn` with every trained weight set to anchor + scale·(weight − anchor), then puts the weights back as they were. */
function atTrialWeights<T>(training: Training, scale: number, fn: () => T): T {
  const { anchor } = stateOf(training);
  const saved: [Tensor, Float32Array][] = [];
  try {
    for (const [n, p] of training.executor.named) {
      const w = p.data as Float32Array;
      const a = anchor.get(n)!;
      saved.push([p, w]);
      p.data = scale === 0 ? a.slice() : a.map((v, i) => Math.fround(v + scale * (w[i] - v)));
    }
    return fn();
  } finally {
    for (const [p, w] of saved) p.data = w;
  }
}

/** The stage requests of scoring; the owner alone may send them. */
export const trialHandlers: Record<string, StageHandler> = {
  'trial-delta': {
    run: ({ body, job }, { fault }) => {
      const training = trainingOf(job);
      const name = parseName(body.name);
      const { anchor } = stateOf(training);
      fixChange(training, fault);
      const p = training.executor.named.get(name);
      const a = anchor.get(name);
      if (!p || !a) throw new InvalidMessageError(`'${name}' is not a trained weight of this section`);
      return { kind: 'tensor', tensor: tensor((p.data as Float32Array).map((v, i) => v - a[i]), p.shape) };
    },
  },
  'trial-forward': {
    maxTensors: 1,
    run: (r, { fault }) => {
      const { weights, scale } = parseTrialForward(r.body);
      const training = trainingOf(r.job);
      stateOf(training);
      fixChange(training, fault);
      const input = fromWire(expectTensors(r.type, r.tensors, 1)[0]);
      const { model } = sectionOf(r.job);
      // on the host, whatever the section trains on: a few forwards a round, and the weights swapped in place
      const output = atTrialWeights(training, weights === 'anchor' ? 0 : scale, () =>
        noGrad(() => runLayers(model.layers, input, {}, model.config.maxPositions)));
      return { kind: 'tensor', tensor: output };
    },
  },
};
