/**
 * A training run's engine, the same to the loop (loop.ts) whether the model trains in this process or across workers:
 * a step, an evaluation, a checkpoint, and what the job reports (checks, workers lost, moves, bytes).
 */
import type { Batch } from '../../data/index.ts';
import type { Traffic } from '../../p2p/index.ts';
import { type BatchGenerator, type CausalLM, LocalTrainer, type LoraConfig, saveAdapter, saveModel } from '../../models/index.ts';
import { noGrad } from '../../tensor/index.ts';
import type { FailoverEvent } from '../failover.ts';
import type { DistributedJob } from '../job.ts';
import type { JobTrainer } from '../job-trainer.ts';
import { RedundantStage } from '../redundant-stage.ts';
import type { VerificationSummary } from '../verifier.ts';
import type { Evaluation, TrainingSource } from './sources.ts';
import {
  localOptimizerState, openOptimizer, readOptimizer, readState, setLocalOptimizerState, type TrainerState, writeOptimizer,
  writeOptimizerStreamed, writeState,
} from './state.ts';

/** One training run's engine: this process, or a model split across workers. */
export interface Runner {
  step(batch: Batch): Promise<{ loss: number; lr: number; tokens: number; busy?: number[][] }>;
  evaluate(): Promise<Evaluation>;
  /** Writes the weights (Hugging Face layout) and whatever else resuming needs. */
  checkpoint(dir: string, state: TrainerState): Promise<void>;
  /** Short names of the pipeline's stages and replicas, for a progress line. */
  stageNames: string[][];
  /** What verification did (across workers). */
  verification?: () => VerificationSummary | null;
  /** Workers lost so far and how the job went on (across workers). */
  failovers?: () => readonly FailoverEvent[];
  /** Bytes the job moved, by kind (across workers). */
  traffic?: () => Traffic;
  /** Times the job moved to a better plan, and why (across workers). */
  replans?: () => readonly { at: number; reason: string; step?: number }[];
  close(): Promise<void>;
}

export interface LocalRunnerOptions {
  source: TrainingSource;
  /** Steps of the whole run (the learning rate's schedule spans them). */
  steps: number;
  lr: number;
  microBatches: number;
  /** A checkpoint to go on from (its optimizer state and step), or null. */
  resumeFrom: string | null;
  /** The LoRA adapter trained over the frozen model, and the base's directory: the checkpoint is the adapter alone, in PEFT's layout. */
  adapter?: { config: LoraConfig; base: string } | null;
  /** Lines for a person (a checkpoint without optimizer state). */
  log?: (line: string) => void;
}

/**
 * A run in this process: LocalTrainer (AdamW, warmup and cosine decay) over `model`.
 * @example
 * const runner = localRunner(model, { source, steps: 100, lr: 1e-3, microBatches: 1, resumeFrom: null })
 */
export function localRunner(model: CausalLM, o: LocalRunnerOptions): Runner {
  const trainer = new LocalTrainer(model, { lr: o.lr, totalSteps: o.steps, microBatches: o.microBatches });
  if (o.resumeFrom) {
    const state = readOptimizer(o.resumeFrom);
    if (state) setLocalOptimizerState(trainer, state);
    else o.log?.('the checkpoint holds no optimizer state: AdamW starts afresh');
    trainer.fastForward(readState(o.resumeFrom).step);
  }
  return {
    step: async (batch) => trainer.step(batch),
    evaluate: () => o.source.evaluate({ logits: async (ids) => noGrad(() => model.eval().forward(ids)), generator: model }),
    checkpoint: async (dir, state) => {
      if (o.adapter) saveAdapter(model, o.adapter.config, dir, o.adapter.base);
      else await saveModel(model, dir);
      writeOptimizer(dir, localOptimizerState(trainer));
      writeState(dir, state);
    },
    stageNames: [],
    close: async () => {},
  };
}

export interface JobRunnerOptions {
  source: TrainingSource;
  /** The model's tokenizer (evaluations generate across the workers). */
  tokenizer: NonNullable<CausalLM['tokenizer']>;
  /** A checkpoint to go on from (its optimizer state, parameter by parameter, and step), or null. */
  resumeFrom: string | null;
  /** Ends the job (and whatever the caller opened for it) when the run is over. */
  close: () => Promise<void>;
  log?: (line: string) => void;
}

/**
 * A run across workers: `trainer` (from `job.trainer(...)`) steps the job; evaluations and checkpoints see the replicas'
 * average; a checkpoint streams weight by weight and parameter by parameter from the workers into the files.
 * @example
 * const job = await swarm.user.distribute('models/tiny', { training: true })
 * const trainer = await job.trainer({ optimizer: { lr: 1e-3 } })
 * const runner = await jobRunner(job, trainer, { source, tokenizer, resumeFrom: null, close: () => job.close() })
 */
export async function jobRunner(job: DistributedJob, trainer: JobTrainer, o: JobRunnerOptions): Promise<Runner> {
  if (o.resumeFrom) {
    trainer.fastForward(readState(o.resumeFrom).step);
    // parameter by parameter: the user never holds the whole optimizer state
    const state = openOptimizer(o.resumeFrom);
    if (state) {
      try {
        await job.restoreOptimizer(state.read);
      } finally {
        state.close();
      }
    } else o.log?.('the checkpoint holds no optimizer state: AdamW starts afresh');
  }
  const generator: BatchGenerator = { tokenizer: o.tokenizer, generateBatch: (p, g) => job.generateBatch(p, g) };
  return {
    step: (batch) => trainer.step(batch),
    evaluate: async () => {
      // replicas taking local steps average first: the evaluation scores their average, not one replica's weights
      await trainer.sync();
      return o.source.evaluate({ logits: (ids) => job.logits(ids), generator });
    },
    checkpoint: async (dir, state) => {
      // as for an evaluation: the checkpoint holds the replicas' average
      await trainer.sync();
      // weight by weight from the workers into the files: the user never holds the whole model
      await job.save(dir);
      await writeOptimizerStreamed(dir, await job.optimizerEntries());
      writeState(dir, state);
    },
    verification: () => job.verification,
    failovers: () => job.failovers,
    replans: () => job.replans,
    traffic: () => job.traffic(),
    // a failover may plan the job again: the stages are those of the pipeline as it is now
    get stageNames() {
      return trainer.stages.map((st) => st.replicas.map((h) => (h instanceof RedundantStage ? `…${h.primary.peerId.slice(-6)}` : 'you')));
    },
    close: o.close,
  };
}
