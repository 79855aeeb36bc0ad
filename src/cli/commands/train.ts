import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { type Batch, loadTextFile, taskBatch, taskByName, textBatch, type Task, type TextDataset } from '../../data/index.ts';
import { readSafetensors, writeSafetensors } from '../../io/index.ts';
import { type CausalLM, evaluateExactMatch, LocalTrainer, loadModel, saveModel } from '../../models/index.ts';
import { crossEntropy, Generator, noGrad, type Tensor, tensor } from '../../tensor/index.ts';
import { type Flags, intFlag, numberFlag, requiredString, requireLocalZero, stringFlag, UsageError } from '../args.ts';
import { bar, type Output } from '../output.ts';

export const trainOptions = {
  'model': { type: 'string' },
  'data': { type: 'string' },
  'task': { type: 'string' },
  'steps': { type: 'string' },
  'batch': { type: 'string' },
  'seq-len': { type: 'string' },
  'lr': { type: 'string' },
  'eval-every': { type: 'string' },
  'eval-size': { type: 'string' },
  'seed': { type: 'string' },
  'out': { type: 'string' },
  'resume': { type: 'boolean' },
  'stop-at': { type: 'string' },
  'local': { type: 'string' },
  'bootstrap': { type: 'string' },
  'schedule': { type: 'string' },
  'micro-batches': { type: 'string' },
  'replicas': { type: 'string' },
} as const;

const STATE_FILE = 'trainer_state.json';
const OPTIMIZER_FILE = 'optimizer.safetensors';

interface TrainerState {
  step: number;
  totalSteps: number;
  lr: number;
  seed: number;
  source: string;
  rng: number[];
  losses: number[];
}

interface Source {
  name: string;
  batch(rng: Generator): Batch;
  evaluate(model: CausalLM): Promise<{ metric: 'accuracy' | 'loss'; value: number }>;
}

function taskSource(task: Task, model: CausalLM, batchSize: number, evalSize: number): Source {
  const tok = model.tokenizer!;
  const pad = tok.eosTokenId ?? 0;
  const maxAnswer = Math.max(...task.test.map((e) => tok.encode(e.answer).length)) + 1;
  return {
    name: `task:${task.name}`,
    batch: (rng) => taskBatch(task, tok, rng, batchSize, pad),
    evaluate: async (m) => {
      const examples = task.test.slice(0, evalSize);
      const { accuracy } = await evaluateExactMatch(m, examples, { terminator: task.terminator, maxNewTokens: maxAnswer });
      return { metric: 'accuracy', value: accuracy };
    },
  };
}

function textSource(path: string, data: TextDataset, batchSize: number, seqLen: number): Source {
  return {
    name: `data:${path}`,
    batch: (rng) => textBatch(data.train, rng, batchSize, seqLen),
    evaluate: async (m) => {
      const rng = new Generator(12345);
      let total = 0;
      const rounds = 4;
      for (let i = 0; i < rounds; i++) {
        const b = textBatch(data.heldOut.length > seqLen + 2 ? data.heldOut : data.train, rng, batchSize, seqLen);
        total += noGrad(() => crossEntropy(m.eval().forward(b.input), b.target).item());
      }
      return { metric: 'loss', value: total / rounds };
    },
  };
}

function saveTrainer(dir: string, trainer: LocalTrainer, state: TrainerState): void {
  const moments = new Map<string, Tensor>();
  for (const [name, p] of trainer.model.namedParameters()) {
    const s = trainer.optimizer.getState(p);
    if (!s) continue;
    moments.set(`${name}.exp_avg`, tensor(s.exp_avg as Float32Array, p.shape));
    moments.set(`${name}.exp_avg_sq`, tensor(s.exp_avg_sq as Float32Array, p.shape));
    moments.set(`${name}.step`, tensor([s.step as number], [1]));
  }
  writeSafetensors(join(dir, OPTIMIZER_FILE), moments);
  writeFileSync(join(dir, STATE_FILE), `${JSON.stringify(state)}\n`);
}

function restoreTrainer(dir: string, trainer: LocalTrainer): TrainerState {
  const state = JSON.parse(readFileSync(join(dir, STATE_FILE), 'utf8')) as TrainerState;
  const moments = readSafetensors(join(dir, OPTIMIZER_FILE));
  for (const [name, p] of trainer.model.namedParameters()) {
    const m = moments.get(`${name}.exp_avg`);
    const v = moments.get(`${name}.exp_avg_sq`);
    const step = moments.get(`${name}.step`);
    if (m && v && step) {
      trainer.optimizer.setState(p, { exp_avg: m.data as Float32Array, exp_avg_sq: v.data as Float32Array, step: step.data[0] });
    }
  }
  trainer.fastForward(state.step);
  return state;
}

/** `tensorlink train` on one machine: progress, periodic evaluation, checkpoints, resume. */
export async function trainCommand(flags: Flags, out: Output): Promise<void> {
  requireLocalZero(flags, 'train');
  for (const f of ['micro-batches', 'replicas'] as const) {
    if (flags[f] !== undefined && intFlag(flags, f, 1) !== 1) throw new UsageError(`--${f} needs distributed training (coming with --local N); use --local 0`);
  }
  const schedule = stringFlag(flags, 'schedule');
  if (schedule !== undefined && schedule !== 'gpipe' && schedule !== '1f1b') throw new UsageError('--schedule must be gpipe or 1f1b');
  const steps = intFlag(flags, 'steps', 0, 1);
  if (flags.steps === undefined) throw new UsageError('--steps is required');
  const taskName = stringFlag(flags, 'task');
  const dataPath = stringFlag(flags, 'data');
  if ((taskName === undefined) === (dataPath === undefined)) throw new UsageError('give exactly one of --task NAME or --data FILE');
  const outDir = stringFlag(flags, 'out');
  const resume = flags.resume === true;
  if (resume && (outDir === undefined || !existsSync(join(outDir, STATE_FILE)))) {
    throw new UsageError(`--resume needs --out DIR holding a ${STATE_FILE} from an earlier run`);
  }
  const modelDir = resume ? outDir! : requiredString(flags, 'model');
  const model = await loadModel(modelDir);
  if (!model.tokenizer) throw new UsageError(`${modelDir} has no tokenizer.json; training needs one to encode the data`);
  const batchSize = intFlag(flags, 'batch', 32);
  const seed = intFlag(flags, 'seed', 0, 0);
  const lr = numberFlag(flags, 'lr', 1e-3);
  const evalEvery = intFlag(flags, 'eval-every', Math.max(1, Math.floor(steps / 5)));
  const evalSize = intFlag(flags, 'eval-size', 200);
  const source = taskName
    ? taskSource(taskByName(taskName, seed), model, batchSize, evalSize)
    : textSource(dataPath!, loadTextFile(dataPath!, model.tokenizer), batchSize, intFlag(flags, 'seq-len', Math.min(128, model.config.maxPositions - 1)));
  const trainer = new LocalTrainer(model, { lr, totalSteps: steps });
  const rng = new Generator(seed + 1);
  let losses: number[] = [];
  let start = 0;
  if (resume) {
    const state = restoreTrainer(outDir!, trainer);
    if (state.source !== source.name) throw new UsageError(`the checkpoint was trained on ${state.source}, not ${source.name}`);
    rng.setState(state.rng);
    losses = state.losses;
    start = state.step;
    out.info(`resuming at step ${start} of ${steps} from ${outDir}`);
  }
  out.info(`training ${model.config.arch} (${model.numParameters()} parameters) on ${source.name}, ${steps} steps, batch ${batchSize}`);
  // --stop-at N: end after step N with a checkpoint, to be continued with --resume (time-sliced runs).
  const stopAt = Math.min(steps, intFlag(flags, 'stop-at', steps));
  if (stopAt < steps && !outDir) throw new UsageError('--stop-at needs --out DIR to hold the checkpoint');
  const evals: { step: number; metric: string; value: number }[] = [];
  const started = performance.now();
  let tokens = 0;
  const checkpoint = async (step: number) => {
    if (!outDir) return;
    await saveModel(model, outDir);
    saveTrainer(outDir, trainer, { step, totalSteps: steps, lr, seed, source: source.name, rng: rng.getState(), losses });
  };
  for (let step = start + 1; step <= stopAt; step++) {
    const r = trainer.step(source.batch(rng));
    losses.push(r.loss);
    tokens += r.tokens;
    const seconds = (performance.now() - started) / 1000;
    out.progress(`${bar(step / steps)} ${step}/${steps}  loss ${r.loss.toFixed(4)}  ${Math.round(tokens / seconds)} tok/s  lr ${r.lr.toExponential(2)}`);
    if (step % evalEvery === 0 || step === steps) {
      const e = await source.evaluate(model);
      evals.push({ step, ...e });
      out.info(`step ${step}  loss ${r.loss.toFixed(4)}  eval ${e.metric} ${e.metric === 'accuracy' ? `${(100 * e.value).toFixed(1)}%` : e.value.toFixed(4)}  ${seconds.toFixed(0)} s`);
      await checkpoint(step);
    } else if (step === stopAt) {
      await checkpoint(step);
    }
  }
  const seconds = (performance.now() - started) / 1000;
  const last = evals.at(-1);
  const result = {
    losses,
    steps: stopAt,
    seconds,
    tokensPerSecond: tokens / seconds,
    evals,
    ...(last ? { [last.metric]: last.value } : {}),
    out: outDir ?? null,
  };
  out.result(
    result,
    `${stopAt} steps in ${seconds.toFixed(1)} s, final loss ${losses.at(-1)?.toFixed(4)}${last ? `, ${last.metric} ${last.metric === 'accuracy' ? `${(100 * last.value).toFixed(1)}%` : last.value.toFixed(4)}` : ''}${outDir ? `, saved to ${outDir}` : ''}`,
  );
}
