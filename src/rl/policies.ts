/**
 * The policies RL trains: a model in this process (its trainable weights, an adapter's factors where it has one),
 * and a job across the swarm (an adapter job over a hosted model's hosts: the hosts hold the factors and step them, so
 * each update is on the hosts for the next rollouts without a transfer).
 */
import {
  type CausalLM, generateBatch, type GenerateOptions, LocalTrainer, type LocalTrainerOptions, type StepResult, type Tokenizer,
  type TrainingBatch,
} from '../models/index.ts';
import { InvalidArgumentError } from '../errors.ts';
import type { DistributedModel } from '../user/index.ts';
import type { Policy } from './rl.ts';
import { tokenLogprobs } from './grpo.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';

/**
 * A model of this process as a policy, stepped by a LocalTrainer (AdamW; a constant rate unless told). `reference`: the
 * policy a KL term keeps it near (a frozen copy of where it started).
 */
export function localPolicy(
  model: CausalLM, options: Omit<LocalTrainerOptions, 'totalSteps'> & { totalSteps?: number; reference?: CausalLM },
): Policy {
  if (!model.tokenizer) throw new InvalidArgumentError('the policy has no tokenizer (tokenizer.json) to write its prompts with');
  // a constant rate (no warm-up, no decay) unless a schedule's length is given
  const trainer = new LocalTrainer(model, { warmupSteps: 0, ...options, totalSteps: options.totalSteps ?? 1e9 });
  return {
    tokenizer: model.tokenizer as Tokenizer,
    get version() {
      return trainer.stepCount;
    },
    generateBatch: (prompts: number[][], o: GenerateOptions) => generateBatch(model, prompts, o),
    step: async (batch) => trainer.step(batch),
    ...(options.reference
      ? {
          referenceLogprobs: async (input: Tensor, picked: Tensor) => {
            const reference = options.reference!;
            reference.eval();
            return noGrad(() => tokenLogprobs(reference.forward(input), picked)).data as Float32Array;
          },
        }
      : {}),
  };
}

/** Logits [B, T, V] of ids [B, T]: a reference policy's (a hosted model's base, served for everyone: HostedModel). */
export interface LogitsSource {
  logits(ids: Tensor): Promise<Tensor>;
}

/** A second job of the policy's adapter that does not train, where rollouts are drawn beside the training job's steps. */
export type RolloutJob = Pick<DistributedModel, 'generateBatch' | 'setAdapter'>;

/**
 * A distributed job as a policy: its generation across its workers, its trainer's steps. `reference`: the policy a KL
 * term keeps it near, where its logits come from (for an adapter job over a hosted model, the model its hosts serve
 * without the adapter). `rollouts`: a second job of the same adapter, not training, that draws the rollouts: before each
 * draw it is given the trainer's factors as they are (content-addressed chunks: only the factors move), so with
 * `overlap` the next step's rollouts run on it while the training job takes a step.
 */
export function jobPolicy(
  job: Pick<DistributedModel, 'generateBatch'> & Partial<Pick<DistributedModel, 'annotateProgress' | 'adapterFactors'>>,
  trainer: { step(batch: TrainingBatch): Promise<StepResult>; readonly stepCount: number },
  tokenizer: Tokenizer,
  options: { reference?: LogitsSource; rollouts?: RolloutJob } = {},
): Policy {
  const { reference, rollouts } = options;
  if (rollouts && !job.adapterFactors) throw new InvalidArgumentError('rollouts drawn apart need the training job\'s adapter factors to give them');
  return {
    tokenizer,
    get version() {
      return trainer.stepCount;
    },
    generateBatch: (prompts, o) => job.generateBatch(prompts, o),
    step: (batch) => trainer.step(batch),
    annotate: (figures) => job.annotateProgress?.(figures),
    ...(reference
      ? {
          referenceLogprobs: async (input: Tensor, picked: Tensor) => {
            const logits = await reference.logits(input);
            return noGrad(() => tokenLogprobs(logits, picked)).data as Float32Array;
          },
        }
      : {}),
    ...(rollouts
      ? {
          rollouts: { generateBatch: (prompts: number[][], o: GenerateOptions) => rollouts.generateBatch(prompts, o) },
          // every time, not once a version: a rollback replays the trainer's steps to other factors under the same count
          syncRollouts: async () => rollouts.setAdapter(await job.adapterFactors!()),
        }
      : {}),
  };
}
