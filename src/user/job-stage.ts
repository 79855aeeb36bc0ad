import { InvalidArgumentError } from '../errors.ts';
import type { CausalLM, ModelLayer } from '../models/index.ts';
import type { StageAssignment } from '../p2p/index.ts';
import type { Plan } from '../plan/index.ts';
import type { RemoteStage } from './remote-stage.ts';
import type { UserModel } from './user-model.ts';

/**
 * The words every part of a distributed job shares (its placement, recovery, sessions and
 * training): a section on a worker, where the job's sections are, and the user's own layers.
 * Nothing here imports a part of the job, so the parts import this and never each other's back.
 */

/** One section of the job on one worker, as the user drives it. */
export interface JobStage {
  where: StageAssignment;
  remote: RemoteStage;
}

/** Where a job's sections are: its id on the workers, its plan and its opened stages. */
export interface Placement {
  jobId: string;
  plan: Plan;
  sections: JobStage[][];
}

/** The layers the user runs itself (its ends, or a whole model it holds); a typed error when it keeps none. */
export function ownEnds(source: UserModel): CausalLM {
  if (!source.ends) throw new InvalidArgumentError('this job keeps no layers on the user\'s side (privacy \'none\')');
  return source.ends;
}

/** The user's own layers: the embedding, and the final norm with the head. */
export function ownEndLayers(source: UserModel): ModelLayer[] {
  const layers = ownEnds(source).layers;
  return [layers[0], ...layers.slice(layers.length - 2)];
}
