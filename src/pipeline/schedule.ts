import { InvalidArgumentError } from '../errors.ts';

/** One unit of pipeline work on a stage: the forward or the backward of micro-batch `micro`. */
export interface Action {
  op: 'F' | 'B';
  micro: number;
}

export type ScheduleName = 'gpipe' | '1f1b';

/** The actions of every stage, in the order each stage runs them. */
export type Schedule = Action[][];

function check(stages: number, micros: number): void {
  if (!Number.isInteger(stages) || stages < 1) throw new InvalidArgumentError(`a pipeline needs ≥ 1 stage, got ${stages}`);
  if (!Number.isInteger(micros) || micros < 1) throw new InvalidArgumentError(`a step needs ≥ 1 micro-batch, got ${micros}`);
}

const forwards = (list: number[]): Action[] => list.map((micro) => ({ op: 'F', micro }));
const backwards = (list: number[]): Action[] => list.map((micro) => ({ op: 'B', micro }));

/**
 * GPipe: every stage runs all its forwards, then all its backwards. A stage holds the
 * activations of all m micro-batches at the turn.
 */
export function gpipeActions(micros: number[]): Action[] {
  return [...forwards(micros), ...backwards(micros)];
}

/**
 * 1F1B (PipeDream-Flush) for stage `stage` of `stages`: p − s − 1 warm-up forwards, then one
 * forward and one backward in turn, then the remaining backwards. A stage holds at most
 * p − s activations.
 */
export function oneFOneBActions(micros: number[], stage: number, stages: number): Action[] {
  const warmup = Math.min(stages - stage - 1, micros.length);
  const out: Action[] = forwards(micros.slice(0, warmup));
  for (let i = 0; i + warmup < micros.length; i++) {
    out.push({ op: 'F', micro: micros[i + warmup] }, { op: 'B', micro: micros[i] });
  }
  out.push(...backwards(micros.slice(Math.max(0, micros.length - warmup))));
  return out;
}

/** The schedule of p stages over micro-batches 0..m−1. */
export function schedule(name: ScheduleName, stages: number, micros: number): Schedule {
  check(stages, micros);
  const list = Array.from({ length: micros }, (_, k) => k);
  return Array.from({ length: stages }, (_, s) => stageActions(name, list, s, stages));
}

/** One stage's actions over the micro-batches it runs (a replica runs a share of them). */
export function stageActions(name: ScheduleName, micros: number[], stage: number, stages: number): Action[] {
  if (name === 'gpipe') return gpipeActions(micros);
  if (name === '1f1b') return oneFOneBActions(micros, stage, stages);
  throw new InvalidArgumentError(`unknown schedule '${String(name)}' (gpipe, 1f1b)`);
}

/** The idle share of a pipeline with equal stages: (p − 1) / (m + p − 1). */
export function bubbleFraction(stages: number, micros: number): number {
  check(stages, micros);
  return (stages - 1) / (micros + stages - 1);
}
