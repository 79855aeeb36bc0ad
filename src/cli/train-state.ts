import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { readSafetensors, writeSafetensors } from '../io/index.ts';
import type { LocalTrainer } from '../models/index.ts';
import { type Tensor, tensor } from '../tensor/index.ts';

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

export function writeState(dir: string, state: TrainerState): void {
  writeFileSync(join(dir, STATE_FILE), `${JSON.stringify(state)}\n`);
}

export function readState(dir: string): TrainerState {
  return JSON.parse(readFileSync(join(dir, STATE_FILE), 'utf8')) as TrainerState;
}

/** AdamW's moments of a one-process run, by parameter name. */
export function saveOptimizer(dir: string, trainer: LocalTrainer): void {
  const moments = new Map<string, Tensor>();
  for (const [name, p] of trainer.model.namedParameters()) {
    const s = trainer.optimizer.getState(p);
    if (!s) continue;
    moments.set(`${name}.exp_avg`, tensor(s.exp_avg as Float32Array, p.shape));
    moments.set(`${name}.exp_avg_sq`, tensor(s.exp_avg_sq as Float32Array, p.shape));
    moments.set(`${name}.step`, tensor([s.step as number], [1]));
  }
  writeSafetensors(join(dir, OPTIMIZER_FILE), moments);
}

/** Restores AdamW's moments if the checkpoint has them (a distributed run's checkpoint does not); true if it did. */
export function restoreOptimizer(dir: string, trainer: LocalTrainer): boolean {
  if (!existsSync(join(dir, OPTIMIZER_FILE))) return false;
  const moments = readSafetensors(join(dir, OPTIMIZER_FILE));
  for (const [name, p] of trainer.model.namedParameters()) {
    const m = moments.get(`${name}.exp_avg`);
    const v = moments.get(`${name}.exp_avg_sq`);
    const step = moments.get(`${name}.step`);
    if (m && v && step) {
      trainer.optimizer.setState(p, { exp_avg: m.data as Float32Array, exp_avg_sq: v.data as Float32Array, step: step.data[0] });
    }
  }
  return true;
}
