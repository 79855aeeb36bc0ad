import { InvalidArgumentError } from '../errors.ts';
import type { Schedule } from './schedule.ts';

export interface Simulation {
  /** Time from the first action to the last. */
  makespan: number;
  /** Busy time of every stage. */
  busy: number[];
  /** Idle share of the stages over the makespan: 1 − Σ busy / (p · makespan). */
  bubble: number;
  /** The most activations each stage held at once (forwards done, backwards not yet). */
  peakActivations: number[];
  /** When each stage's actions started, in its order. */
  starts: number[][];
}

/**
 * Runs a schedule on an ideal pipeline: a forward of stage s takes `forward[s]`, a backward
 * `backward[s]`, messages are free. Every action waits for its stage and its dependencies
 * (the forward of the stage before for F; the backward of the stage after, and its own
 * forward, for B). Throws if a stage's order would deadlock or a micro-batch is missing.
 */
export function simulate(plan: Schedule, times: { forward?: number[]; backward?: number[] } = {}): Simulation {
  const p = plan.length;
  const micros = new Set(plan.flatMap((actions) => actions.map((a) => a.micro)));
  for (const [s, actions] of plan.entries()) {
    for (const op of ['F', 'B'] as const) {
      const seen = actions.filter((a) => a.op === op).map((a) => a.micro);
      if (seen.length !== micros.size || new Set(seen).size !== micros.size) {
        throw new InvalidArgumentError(`stage ${s} must run ${op} of each micro-batch exactly once`);
      }
    }
  }
  const tf = (s: number) => times.forward?.[s] ?? 1;
  const tb = (s: number) => times.backward?.[s] ?? 2;
  const done = new Map<string, number>();
  const key = (op: string, s: number, k: number) => `${op}${s}:${k}`;
  const next = new Array<number>(p).fill(0);
  const free = new Array<number>(p).fill(0);
  const busy = new Array<number>(p).fill(0);
  const held = new Array<number>(p).fill(0);
  const peak = new Array<number>(p).fill(0);
  const starts: number[][] = plan.map(() => []);
  let remaining = plan.reduce((n, a) => n + a.length, 0);
  while (remaining > 0) {
    let progressed = false;
    for (let s = 0; s < p; s++) {
      const a = plan[s][next[s]];
      if (!a) continue;
      const deps = a.op === 'F'
        ? (s > 0 ? [key('F', s - 1, a.micro)] : [])
        : [key('F', s, a.micro), ...(s < p - 1 ? [key('B', s + 1, a.micro)] : [])];
      if (!deps.every((d) => done.has(d))) continue;
      const start = Math.max(free[s], ...deps.map((d) => done.get(d)!));
      const cost = a.op === 'F' ? tf(s) : tb(s);
      starts[s].push(start);
      free[s] = start + cost;
      busy[s] += cost;
      done.set(key(a.op, s, a.micro), free[s]);
      held[s] += a.op === 'F' ? 1 : -1;
      peak[s] = Math.max(peak[s], held[s]);
      next[s]++;
      remaining--;
      progressed = true;
    }
    if (!progressed) throw new InvalidArgumentError('the schedule deadlocks: every stage waits on another');
  }
  const makespan = Math.max(...free);
  const bubble = 1 - busy.reduce((a, b) => a + b, 0) / (p * makespan);
  return { makespan, busy, bubble, peakActivations: peak, starts };
}
