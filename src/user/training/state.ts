/**
 * A training run's checkpoint besides its weights: where the run was (trainer_state.json: step, data order, losses) and
 * AdamW's state (optimizer.safetensors), in one layout whether the run was one process or a job across workers.
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { readSafetensors, SafetensorsReader, SafetensorsWriter, writeSafetensors } from '../../io/index.ts';
import { layerParameters, type LocalTrainer } from '../../models/index.ts';
import { type Tensor, tensor } from '../../tensor/index.ts';

export const STATE_FILE = 'trainer_state.json';
const OPTIMIZER_FILE = 'optimizer.safetensors';

/** What `train --resume` needs besides the weights: where the run was, its data order, its losses. */
export interface TrainerState {
  step: number;
  totalSteps: number;
  lr: number;
  seed: number;
  source: string;
  rng: number[];
  losses: number[];
}

/**
 * Writes where the run was into `dir`.
 * @example
 * writeState('out', { step: 10, totalSteps: 100, lr: 1e-3, seed: 0, source: 'task:addition', rng: rng.getState(), losses })
 */
export function writeState(dir: string, state: TrainerState): void {
  writeFileSync(join(dir, STATE_FILE), `${JSON.stringify(state)}\n`);
}

/**
 * Where the run whose checkpoint is in `dir` was.
 * @example
 * const { step } = readState('out')
 */
export function readState(dir: string): TrainerState {
  return JSON.parse(readFileSync(join(dir, STATE_FILE), 'utf8')) as TrainerState;
}

/** AdamW's state per parameter (checkpoint names): exp_avg and exp_avg_sq as one [2, ...shape] tensor, and the step count. */
export type OptimizerState = Map<string, { moments: Tensor; step: number }>;

/** Writes optimizer state as `NAME.exp_avg`, `NAME.exp_avg_sq`, `NAME.step` (the same file in one process or across workers). */
export function writeOptimizer(dir: string, state: OptimizerState): void {
  const out = new Map<string, Tensor>();
  for (const [name, { moments, step }] of state) {
    const half = moments.size / 2;
    const shape = moments.shape.slice(1);
    const d = moments.data as Float32Array;
    out.set(`${name}.exp_avg`, tensor(d.slice(0, half), shape));
    out.set(`${name}.exp_avg_sq`, tensor(d.slice(half), shape));
    out.set(`${name}.step`, tensor([step], [1]));
  }
  writeSafetensors(join(dir, OPTIMIZER_FILE), out);
}

/**
 * Writes optimizer state in the same layout as writeOptimizer, parameter by parameter as each
 * one's moments arrive (from the workers): only one parameter's state is held at a time.
 */
export async function writeOptimizerStreamed(
  dir: string,
  entries: { name: string; shape: number[]; step: number; moments: () => Promise<Tensor> }[],
): Promise<void> {
  const planned = entries.flatMap((e) => [
    { name: `${e.name}.exp_avg`, shape: e.shape, dtype: 'F32' as const },
    { name: `${e.name}.exp_avg_sq`, shape: e.shape, dtype: 'F32' as const },
    { name: `${e.name}.step`, shape: [1], dtype: 'F32' as const },
  ]);
  const writer = SafetensorsWriter.create(join(dir, OPTIMIZER_FILE), planned);
  try {
    for (const e of entries) {
      const moments = await e.moments();
      const half = moments.size / 2;
      const d = moments.data as Float32Array;
      writer.write(`${e.name}.exp_avg`, tensor(d.subarray(0, half), e.shape));
      writer.write(`${e.name}.exp_avg_sq`, tensor(d.subarray(half), e.shape));
      writer.write(`${e.name}.step`, tensor([e.step], [1]));
    }
    writer.close();
  } finally {
    writer.abandon();
  }
}

/**
 * The optimizer state of a checkpoint read parameter by parameter (null for a parameter it does
 * not hold), and a close; null if the checkpoint holds no optimizer state.
 */
export function openOptimizer(dir: string): { read: (name: string) => { moments: Tensor; step: number } | null; close: () => void } | null {
  if (!existsSync(join(dir, OPTIMIZER_FILE))) return null;
  const file = SafetensorsReader.open(join(dir, OPTIMIZER_FILE));
  return {
    read: (name) => {
      if (!file.has(`${name}.exp_avg`) || !file.has(`${name}.exp_avg_sq`) || !file.has(`${name}.step`)) return null;
      const m = file.read(`${name}.exp_avg`);
      const v = file.read(`${name}.exp_avg_sq`);
      const both = new Float32Array(2 * m.size);
      both.set(m.data as Float32Array);
      both.set(v.data as Float32Array, m.size);
      return { moments: tensor(both, [2, ...m.shape]), step: file.read(`${name}.step`).data[0] };
    },
    close: () => file.close(),
  };
}

/** The optimizer state a checkpoint holds, or null if it holds none. */
export function readOptimizer(dir: string): OptimizerState | null {
  if (!existsSync(join(dir, OPTIMIZER_FILE))) return null;
  const file = readSafetensors(join(dir, OPTIMIZER_FILE));
  const state: OptimizerState = new Map();
  for (const key of file.keys()) {
    if (!key.endsWith('.exp_avg')) continue;
    const name = key.slice(0, -'.exp_avg'.length);
    const m = file.get(key)!;
    const v = file.get(`${name}.exp_avg_sq`);
    const step = file.get(`${name}.step`);
    if (!v || !step) continue;
    const both = new Float32Array(2 * m.size);
    both.set(m.data as Float32Array);
    both.set(v.data as Float32Array, m.size);
    state.set(name, { moments: tensor(both, [2, ...m.shape]), step: step.data[0] });
  }
  return state;
}

/** The optimizer state of a one-process run. */
export function localOptimizerState(trainer: LocalTrainer): OptimizerState {
  const state: OptimizerState = new Map();
  for (const [name, p] of layerParameters(trainer.model.layers)) {
    const m = trainer.optimizer.moments(p);
    if (m) state.set(name, m);
  }
  return state;
}

/** Restores a one-process run's optimizer state. */
export function setLocalOptimizerState(trainer: LocalTrainer, state: OptimizerState): void {
  for (const [name, p] of layerParameters(trainer.model.layers)) {
    const s = state.get(name);
    if (s) trainer.optimizer.setMoments(p, s.moments, s.step);
  }
}
