import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { type DctTopkOptions, parseActivationCodec, parseDctTopk } from '../../compress/index.ts';
import { taskByName } from '../../data/index.ts';
import { MAX_SYNC_EVERY } from '../../p2p/index.ts';
import {
  adaptModel, adapterState, type CausalLM, heldBytes, loadAdapter, loadConfig, loadModel, loadTokenizer, type LoraConfig, parseLoraSpec,
  partBytes, readAdapterConfig, weightFormat,
} from '../../models/index.ts';
import {
  type AdapterOption, distribute, jobRunner, localRunner, readState, type RoundReport, type Runner, runTraining, STATE_FILE, taskSource,
  textData, textSource, type TrainerState, type TrainingSource, type VerifyOptions,
} from '../../user/index.ts';
import { Generator } from '../../tensor/index.ts';
import type { StrategyName } from '../../plan/index.ts';
import { loadProgress } from '../load-progress.ts';
import { joinSwarm } from '../swarm.ts';
import { payForJob } from '../chain-flags.ts';
import {
  type Flags, intFlag, numberFlag, placement, planFlags, requiredString, stringFlag, UsageError, verifyFlags, weightFlags,
} from '../args.ts';
import { bar, failoverLine, type Output } from '../output.ts';

/** `--adapter` across workers: the folder to go on from (the checkpoint on --resume), or a new adapter's config and seed. */
function remoteAdapterOf(flag: string, resumeFrom: string | null, seed: number, out: Output): AdapterOption {
  const from = resumeFrom ?? (existsSync(flag) ? flag : null);
  let option: AdapterOption;
  if (from) option = from;
  else {
    try {
      option = { ...parseLoraSpec(flag), seed };
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
  }
  const c = typeof option === 'string' ? readAdapterConfig(option) : option;
  out.info(`LoRA r ${c.r}, alpha ${c.alpha} on ${String(c.targets)}${from ? ` from ${from}` : ''}: each worker trains its section's factors over the frozen base`);
  return option;
}

/**
 * The adapter `--adapter` asks for on the model (the base frozen): a PEFT adapter folder to go on training, or
 * `lora[:r=8,alpha=16,targets=…]` for a new one drawn from `seed`; on --resume, the one the checkpoint holds. Says
 * what trains and what it holds.
 */
function adapterOf(model: CausalLM, flag: string, resumeFrom: string | null, seed: number, out: Output): LoraConfig {
  let config: LoraConfig;
  if (resumeFrom) config = loadAdapter(model, resumeFrom);
  else if (existsSync(flag)) config = loadAdapter(model, flag);
  else {
    try {
      config = parseLoraSpec(flag);
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    adaptModel(model, config, { seed });
  }
  const trainable = model.trainableParameters().reduce((n, p) => n + p.size, 0);
  const base = heldBytes(model) - 4 * trainable;
  // an adapter's weights, gradients and two AdamW moments: 16 bytes a parameter; full training: 16 bytes a base parameter
  out.info(`LoRA r ${config.r}, alpha ${config.alpha} on ${adapterState(model).size / 2} layers: ${trainable} parameters train `
    + `(${(16 * trainable / 2 ** 20).toFixed(2)} MiB with gradients and moments) over a frozen base of ${(base / 2 ** 20).toFixed(2)} MiB`);
  return config;
}

/** What a run across workers starts from: the checkpoint directory (sections stream from it), its data, its schedule. */
interface JobSettings {
  dir: string;
  tokenizer: NonNullable<CausalLM['tokenizer']>;
  source: TrainingSource;
  steps: number;
  lr: number;
  microBatches: number;
  resumeFrom: string | null;
  /** The adapter the job puts on every section (a PEFT folder, or a config and seed for new factors). */
  remoteAdapter?: AdapterOption;
}

interface PipelineFlags {
  schedule: 'gpipe' | '1f1b';
  strategy: StrategyName;
  privacy: 'ends' | 'none';
  replicas: number;
  verify: VerifyOptions;
  /** Steps between copies of the job's state that a failover rebuilds from (undefined: the job's default). */
  snapshotEvery: number | undefined;
  compressGrads: DctTopkOptions | undefined;
  compressActivations: 'fp16' | 'int8' | undefined;
  /** Local steps between the replicas' averages (1: gradients summed every step). */
  syncEvery: number;
  /** Score the replicas' changes on held-out data before each average (`--score`). */
  score: boolean;
}

function pipelineFlags(flags: Flags, microBatches: number): PipelineFlags {
  const schedule = stringFlag(flags, 'schedule') ?? '1f1b';
  if (schedule !== 'gpipe' && schedule !== '1f1b') throw new UsageError('--schedule must be gpipe or 1f1b');
  const { strategy, privacy } = planFlags(flags, 'parameter-balanced');
  const replicas = intFlag(flags, 'replicas', 1);
  if (microBatches < replicas) throw new UsageError(`--replicas ${replicas} needs --micro-batches ≥ ${replicas} (each replica takes a share)`);
  const snapshotEvery = flags['snapshot-every'] === undefined ? undefined : intFlag(flags, 'snapshot-every', 0, 0);
  const grads = stringFlag(flags, 'compress-grads');
  const compressGrads = grads === undefined || grads === 'none' ? undefined : parseDctTopk(grads);
  const codec = parseActivationCodec(stringFlag(flags, 'compress-activations') ?? 'none');
  const compressActivations = codec === 'none' ? undefined : codec;
  const syncEvery = intFlag(flags, 'sync-every', 1);
  if (syncEvery > MAX_SYNC_EVERY) throw new UsageError(`--sync-every must be at most ${MAX_SYNC_EVERY}, got ${syncEvery}`);
  if (syncEvery > 1 && replicas < 2) throw new UsageError('--sync-every N averages the replicas of each section: it needs --replicas R with R ≥ 2');
  const verify = verifyFlags(flags);
  const score = flags.score === true || flags.score === 'true';
  if (score && syncEvery < 2) throw new UsageError('--score scores the replicas\' local steps before each average: it needs --replicas R --sync-every N with N ≥ 2');
  return { schedule, strategy, privacy, replicas, verify, snapshotEvery, compressGrads, compressActivations, syncEvery, score };
}

async function distributedRunner(s: JobSettings, flags: Flags, p: PipelineFlags, out: Output): Promise<Runner> {
  const where = placement(flags);
  if (where.kind === 'local') throw new UsageError('training across workers needs --local N (N ≥ 1) or --bootstrap ADDR');
  const { schedule, strategy, privacy, replicas, verify, snapshotEvery, compressGrads, compressActivations, syncEvery } = p;
  const access = await joinSwarm(where, flags);
  let dm: Awaited<ReturnType<typeof distribute>> | null = null;
  const close = async () => {
    await dm?.close();
    await access.close();
  };
  try {
    const onProgress = loadProgress(out);
    const adapter = s.remoteAdapter ? { adapter: s.remoteAdapter, ...weightFlags(flags) } : {};
    const jobOptions = { strategy, privacy, replicas, training: true, onProgress, verify, ...adapter };
    dm = await distribute(access.node, access.bootstrap, s.dir, jobOptions);
    await payForJob(flags, { jobId: dm.jobId, user: access.node.peerId.toString() }, out);
    if ((verify.redundancy ?? 1) > 1) out.info(`  every section runs on ${verify.redundancy} workers; their results are compared bit for bit before one is used`);
    for (const a of dm.assignment) {
      const layers = a.end - a.start === 1 ? `layer ${a.start}` : `layers ${a.start}–${a.end - 1}`;
      out.info(`  worker …${a.peerId.slice(-6)}: ${layers}${replicas > 1 ? ` (replica ${a.replica})` : ''}`);
    }
    if (privacy === 'ends') out.info('  this machine: the embedding, the final norm and the head (token ids and logits stay here)');
    const { steps: totalSteps, microBatches } = s;
    const compression = {
      ...(compressGrads ? { compressGrads } : {}),
      ...(compressActivations ? { compressActivations } : {}),
      ...(syncEvery > 1 ? { syncEvery } : {}),
    };
    // --score: each round's held-out batch drawn from a generator of the round's step (a replay draws the same)
    const seed = intFlag(flags, 'seed', 0, 0);
    const rounds = (r: RoundReport) => {
      const gone = r.excluded.length > 0 ? `; excluded ${r.excluded.map((x) => `…${x.slice(-6)}`).join(', ')}` : '';
      out.info(`  scored replicas after step ${r.step}: ${r.replicas.map((x) => `…${x.peer.slice(-6)} ${x.value.toFixed(2)}`).join(', ')}${gone}`);
    };
    const held = (step: number) => s.source.heldOutBatch(new Generator(seed * 7919 + step));
    const score = p.score ? { score: { batch: held, onRound: rounds } } : {};
    const options = { optimizer: { lr: s.lr }, totalSteps, microBatches, schedule, replicas, snapshotEvery, ...compression, ...score };
    const trainer = await dm.trainer(options);
    const sent = syncEvery > 1 ? `take ${syncEvery} local steps, then average their weights' changes` : 'exchange gradients every step';
    if (compressGrads) {
      const { k, chunk, bits } = compressGrads;
      out.info(`  replicas ${sent}, DCT top-k compressed: ${k} of each ${chunk}×${chunk} block, ${bits}-bit values, error feedback`);
    } else if (syncEvery > 1) out.info(`  replicas ${sent} (float32)`);
    if (compressActivations) out.info(`  activations and their gradients travel as ${compressActivations}`);
    const { source, tokenizer, resumeFrom } = s;
    return await jobRunner(dm, trainer, { source, tokenizer, resumeFrom, close, log: (l) => out.info(l) });
  } catch (err) {
    await close();
    throw err;
  }
}

/** `tensorlink train`: on this machine (--local 0) or across workers, with progress, evaluation, checkpoints, resume. */
export async function trainCommand(flags: Flags, out: Output): Promise<void> {
  const where = placement(flags);
  const microBatches = intFlag(flags, 'micro-batches', 1);
  if (where.kind === 'local') {
    for (const f of ['replicas', 'schedule', 'strategy', 'privacy', 'compress-grads', 'compress-activations', 'sync-every'] as const) {
      if (flags[f] !== undefined) throw new UsageError(`--${f} is for training across workers (--local N with N ≥ 1, or --bootstrap ADDR)`);
    }
  }
  const pipeline = where.kind === 'local' ? null : pipelineFlags(flags, microBatches);
  // an integer ≥ 1: the parser checked it against its declaration
  const steps = Number(requiredString(flags, 'steps'));
  const taskName = stringFlag(flags, 'task');
  const dataPath = stringFlag(flags, 'data');
  if ((taskName === undefined) === (dataPath === undefined)) throw new UsageError('give exactly one of --task NAME or --data FILE');
  const outDir = stringFlag(flags, 'out');
  const resume = flags.resume === true;
  if (resume && (outDir === undefined || !existsSync(join(outDir, STATE_FILE)))) {
    throw new UsageError(`--resume needs --out DIR holding a ${STATE_FILE} from an earlier run`);
  }
  const adapterFlag = stringFlag(flags, 'adapter');
  // an adapter run's checkpoint is the adapter alone: it resumes over the same --model
  const modelDir = resume && !adapterFlag ? outDir! : requiredString(flags, 'model');
  const format = weightFormat(weightFlags(flags));
  if (format && !adapterFlag) {
    throw new UsageError(`--${flags.quantize ? 'quantize' : 'dtype'} ${format}: compact weights are frozen, so there is nothing to train in them; train an adapter over them (--adapter lora)`);
  }
  const model = where.kind === 'local' ? await loadModel(modelDir, weightFlags(flags)) : null;
  const adapter = model && adapterFlag ? adapterOf(model, adapterFlag, resume ? outDir! : null, intFlag(flags, 'seed', 0, 0), out) : null;
  const remoteAdapter = !model && adapterFlag ? remoteAdapterOf(adapterFlag, resume ? outDir! : null, intFlag(flags, 'seed', 0, 0), out) : undefined;
  const config = model?.config ?? loadConfig(modelDir);
  const tokenizer = model ? model.tokenizer : loadTokenizer(modelDir);
  if (!tokenizer) throw new UsageError(`${modelDir} has no tokenizer.json; training needs one to encode the data`);
  const batchSize = intFlag(flags, 'batch', 32);
  if (microBatches > batchSize) throw new UsageError(`--micro-batches ${microBatches} is more than the batch of ${batchSize}`);
  const seed = intFlag(flags, 'seed', 0, 0);
  const lr = numberFlag(flags, 'lr', 1e-3);
  const evalEvery = intFlag(flags, 'eval-every', Math.max(1, Math.floor(steps / 5)));
  const evalSize = intFlag(flags, 'eval-size', 200);
  const source = taskName
    ? taskSource(taskByName(taskName, seed), tokenizer, batchSize, evalSize)
    : textSource(dataPath!, textData(dataPath!, tokenizer), batchSize, intFlag(flags, 'seq-len', Math.min(128, config.maxPositions - 1)));
  let resumeState: TrainerState | null = null;
  if (resume) {
    resumeState = readState(outDir!);
    if (resumeState.source !== source.name) throw new UsageError(`the checkpoint was trained on ${resumeState.source}, not ${source.name}`);
    out.info(`resuming at step ${resumeState.step} of ${steps} from ${outDir}`);
  }
  // --stop-at N: end after step N with a checkpoint, to be continued with --resume (time-sliced runs).
  const stopAt = Math.min(steps, intFlag(flags, 'stop-at', steps));
  if (stopAt < steps && !outDir) throw new UsageError('--stop-at needs --out DIR to hold the checkpoint');
  const where_ = where.kind === 'local' ? 'this process' : where.kind === 'swarm' ? `a local swarm of ${where.workers} workers` : where.bootstrap;
  const parameters = partBytes(config, [0, config.layers + 3]) / 4;
  out.info(`training ${config.arch} (${parameters} parameters) on ${source.name}, ${steps} steps, batch ${batchSize}, on ${where_}`);
  const resumeFrom = resume ? outDir! : null;
  const log = (line: string) => out.info(line);
  const runner = model
    ? localRunner(model, { source, steps, lr, microBatches, resumeFrom, adapter: adapter && { config: adapter, base: modelDir }, log })
    : await distributedRunner({
        dir: modelDir, tokenizer, source, steps, lr, microBatches, resumeFrom, ...(remoteAdapter ? { remoteAdapter } : {}),
      }, flags, pipeline!, out);
  let flagged = 0;
  let failedOver = 0;
  let moved = 0;
  /** What happened to the job since the last report (workers caught or lost, moves), during `what`. */
  const report = (what: string) => {
    const caught = runner.verification?.()?.flagged ?? [];
    for (const peer of caught.slice(flagged)) out.info(`${what}: worker …${peer.slice(-6)} was caught cheating: flagged at the validator and excluded from the job`);
    flagged = caught.length;
    const failovers = runner.failovers?.() ?? [];
    for (const e of failovers.slice(failedOver)) out.info(`${what}: ${failoverLine(e)}`);
    failedOver = failovers.length;
    const replans = runner.replans?.() ?? [];
    for (const e of replans.slice(moved)) out.info(`${what}: planned again (${e.reason})`);
    moved = replans.length;
  };
  const run = await runTraining({
    runner, source, steps, stopAt, evalEvery, seed, lr, ...(outDir ? { out: outDir } : {}), resumeFrom: resumeState,
    onPhase: report,
    onStep: (r) => {
      const stagesLine = r.busy ? `  stages ${runner.stageNames.map((n, s) => n.map((x, j) => `${x} ${(1000 * r.busy![s][j]).toFixed(0)}ms`).join('/')).join(' → ')}` : '';
      out.progress(`${bar(r.step / steps)} ${r.step}/${steps}  loss ${r.loss.toFixed(4)}  ${Math.round(r.tokens / r.seconds)} tok/s  lr ${r.lr.toExponential(2)}${stagesLine}`);
    },
    onEvaluation: ({ step, loss, evaluation: e, seconds }) => {
      out.info(`step ${step}  loss ${loss.toFixed(4)}  eval ${e.metric} ${e.metric === 'accuracy' ? `${(100 * e.value).toFixed(1)}%` : e.value.toFixed(4)}  ${seconds.toFixed(0)} s`);
    },
  });
  const { losses, evals, busy, seconds } = run;
  const last = evals.at(-1);
  const result = {
    losses,
    steps: stopAt,
    seconds,
    tokensPerSecond: run.tokens / seconds,
    evals,
    ...(last ? { [last.metric]: last.value } : {}),
    ...(last?.perplexity === undefined ? {} : { perplexity: last.perplexity }),
    ...(runner.traffic ? { bytes: runner.traffic() } : {}),
    ...(runner.verification ? { verification: runner.verification() } : {}),
    ...(runner.failovers ? { failovers: runner.failovers(), replans: runner.replans?.() ?? [] } : {}),
    ...(runner.stageNames.length > 0
      ? { stages: runner.stageNames.map((names, s) => names.map((name, j) => ({ name, busySeconds: busy[s][j] }))) }
      : {}),
    out: outDir ?? null,
  };
  out.result(
    result,
    `${stopAt} steps in ${seconds.toFixed(1)} s, final loss ${losses.at(-1)?.toFixed(4)}${last ? `, ${last.metric} ${last.metric === 'accuracy' ? `${(100 * last.value).toFixed(1)}%` : last.value.toFixed(4)}` : ''}${outDir ? `, saved to ${outDir}` : ''}`,
  );
}
