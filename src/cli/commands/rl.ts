import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { adaptModel, loadModel, loadTokenizer, type LoraConfig, parseLoraSpec } from '../../models/index.ts';
import {
  type GrpoPreset, GRPO_PRESETS, jobPolicy, loadTask, localPolicy, type Policy, rl, type RlResult, type RlStepStats, type RlTask,
  rlTaskByName,
} from '../../rl/index.ts';
import { distribute, HostedModel, pullEnds } from '../../user/index.ts';
import { validatorTarget } from '../../p2p/index.ts';
import { payForJob } from '../chain-flags.ts';
import { openHosted } from './generate-hosted.ts';
import { joinSwarm } from '../swarm.ts';
import { type Flags, intFlag, numberFlag, placement, requiredString, stringFlag, UsageError, verifyFlags } from '../args.ts';
import { bar, type Output } from '../output.ts';

/** The task `--task` names: a built-in one, or a JS module of one's own. */
async function taskOf(name: string, seed: number): Promise<RlTask> {
  if (/\.(m?js)$/.test(name)) return loadTask(name);
  try {
    return rlTaskByName(name, seed);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

function loraOf(flag: string): LoraConfig {
  try {
    return parseLoraSpec(flag);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;

/** The run in a line: the reward's first and last steps, held-out accuracy before and after. */
function summary(r: RlResult): string {
  const first = r.steps[0];
  const last = r.steps.at(-1)!;
  const held = r.accuracyBefore === undefined || r.accuracyAfter === undefined
    ? ''
    : `; held-out exact match ${pct(r.accuracyBefore)} → ${pct(r.accuracyAfter)}`;
  return `reward ${first.reward.toFixed(3)} (step 1) → ${last.reward.toFixed(3)} (step ${last.step})${held}`;
}

/**
 * `tensorlink rl --task NAME|FILE.mjs --model DIR|NAME`: GRPO (rl/rl.ts). In this process on a checkpoint directory;
 * with --bootstrap (or --local N) across the swarm: over a model hosted for everyone (`--model NAME`: its ends pulled
 * here, a LoRA adapter trained over its hosts, who generate the rollouts with it), or as a private job of a directory.
 */
export async function rlCommand(flags: Flags, out: Output): Promise<void> {
  const seed = intFlag(flags, 'seed', 0, 0);
  const task = await taskOf(requiredString(flags, 'task'), seed);
  const model = requiredString(flags, 'model');
  const presetName = (stringFlag(flags, 'preset') ?? 'grpo') as GrpoPreset;
  if (!(presetName in GRPO_PRESETS)) throw new UsageError(`--preset must be one of ${Object.keys(GRPO_PRESETS).join(', ')}`);
  const beta = numberFlag(flags, 'beta', 0);
  const lr = numberFlag(flags, 'lr', 1e-3);
  const steps = intFlag(flags, 'steps', 50);
  const options = {
    task, steps, seed, preset: presetName, grpo: { beta },
    prompts: intFlag(flags, 'prompts', 8), groupSize: intFlag(flags, 'group', 8, 2),
    overlap: flags.overlap === true, evalEvery: intFlag(flags, 'eval-every', 10, 0), evalSize: intFlag(flags, 'eval-size', 200),
  };
  const adapterFlag = stringFlag(flags, 'adapter');
  // a step's batch in two micro-batches (a job's pipeline overlaps them across its stages)
  const microBatches = Math.min(2, options.prompts * options.groupSize);
  const where = placement(flags);
  const line = (s: RlStepStats) => `${bar(s.step / steps)} ${s.step}/${steps}  reward ${s.reward.toFixed(3)}  solved ${pct(s.solved)}  `
    + `clipped ${pct(s.clipped)}${s.kl === undefined ? '' : `  KL ${s.kl.toExponential(2)}`}${s.stale ? '  stale 1' : ''}  rollouts ${Math.round(s.rolloutTokensPerSecond).toLocaleString('en-US')} tok/s`
    + `${s.accuracy === undefined ? '' : `  held-out ${pct(s.accuracy)}`}`;
  const onStep = (s: RlStepStats) => {
    if (s.accuracy !== undefined || s.step === steps) out.info(line(s));
    else out.progress(line(s));
  };
  out.info(`GRPO (${presetName}${beta > 0 ? `, KL β ${beta}` : ''}) on ${task.name}: ${options.prompts} prompts × ${options.groupSize} `
    + `completions a step, ${steps} steps${options.overlap ? ', rollouts one step stale (drawn before the last update)' : ''}`);

  if (where.kind === 'local') {
    if (!existsSync(model)) throw new UsageError(`--model ${model}: no such directory (a hosted model's name needs --bootstrap)`);
    const policyModel = await loadModel(model);
    if (adapterFlag) adaptModel(policyModel, loraOf(adapterFlag), { seed });
    const reference = beta > 0 ? await loadModel(model) : undefined;
    // the schedule and micro-batches of a job's trainer (below): the same run here and across the swarm
    const policy = localPolicy(policyModel, { lr, totalSteps: steps, warmupSteps: 0, microBatches, ...(reference ? { reference } : {}) });
    const result = await rl({ ...options, policy, onStep });
    out.result({ task: task.name, where: 'this process', ...result }, summary(result));
    return;
  }

  const hosted = !existsSync(model);
  if (beta > 0 && !hosted) {
    throw new UsageError('--beta > 0 (a KL term) over a private job needs a reference model to read log-probabilities from: in this process, or '
      + 'over a hosted model (the model its hosts serve is the reference)');
  }
  const access = await joinSwarm(where, flags);
  let ends: string | null = null;
  let dm: Awaited<ReturnType<typeof distribute>> | null = null;
  let base: HostedModel | null = null;
  let drawer: Awaited<ReturnType<typeof distribute>> | null = null;
  let drawerEscrow: { job: string; user: string } | null = null;
  try {
    let dir = model;
    if (hosted) {
      // the user runs the ends of a hosted model: pulled from a host, checked against the model's hash
      ends = mkdtempSync(join(tmpdir(), 'tl-rl-ends-'));
      await pullEnds(access.node, validatorTarget(access.bootstrap), model, ends);
      dir = ends;
    }
    const tokenizer = loadTokenizer(dir);
    if (!tokenizer) throw new UsageError(`${model}: no tokenizer (tokenizer.json) to write the prompts with`);
    const lora = adapterFlag ? loraOf(adapterFlag) : hosted ? loraOf('lora:r=8,alpha=16') : null;
    const verify = verifyFlags(flags);
    dm = await distribute(access.node, access.bootstrap, dir, {
      training: true, verify, ...(lora ? { adapter: { ...lora, seed } } : {}), ...(hosted ? { hosted: model } : {}),
    });
    const user = access.node.peerId.toString();
    // the escrow's job: the first id (a job planned again runs under one that names it, paid from the same escrow)
    const escrow = { job: dm.jobId, user };
    await payForJob(flags, { jobId: escrow.job, user }, out);
    for (const a of dm.assignment) out.info(`  ${hosted ? 'host' : 'worker'} …${a.peerId.slice(-6)}: layers ${a.start}–${a.end - 1}`);
    out.info(hosted
      ? `  a LoRA adapter (r ${lora!.r}) over ${model} as its hosts serve it: they hold its factors, step them and generate the rollouts`
      : `  a private job${lora ? ` training a LoRA adapter (r ${lora.r})` : ''}: the workers generate the rollouts and train`);
    const trainer = await dm.trainer({ optimizer: { lr }, totalSteps: steps, warmupSteps: 0, microBatches });
    // the KL term's reference: the model as its hosts serve it to everyone, without the adapter; checked as `generate
    // --model` checks it, and with --contracts paid as it is, from the user's escrow for the model
    if (beta > 0) base = await openHosted(HostedModel, access, model, await loadModel(dir, { part: 'ends' }), flags, out);
    if (hosted && options.overlap) {
      // the rollouts beside each step: a second job of the adapter over the hosts, not training, given the factors before each draw
      drawer = await distribute(access.node, access.bootstrap, dir, { verify, adapter: { ...lora!, seed }, hosted: model });
      drawerEscrow = { job: drawer.jobId, user };
      await payForJob(flags, { jobId: drawerEscrow.job, user }, out);
      out.info(`  the rollouts beside each step: a second job of the adapter over ${drawer.assignment.length} hosts, given the factors before each draw`);
    }
    const apart = { ...(base ? { reference: base } : {}), ...(drawer ? { rollouts: drawer } : {}) };
    const policy: Policy = jobPolicy(dm, trainer, tokenizer, apart);
    const result = await rl({ ...options, policy, onStep });
    const verification = await dm.settle();
    const drawn = await drawer?.settle();
    const referenced = base && { checked: base.verification.checked, failed: base.verification.failed, flagged: base.verification.flagged };
    const ledgerError = await base?.drain();
    if (ledgerError) out.info(`warning: the validator's ledger did not take every step of the reference: ${ledgerError.message}`);
    for (const [what, v] of [['checks', verification], ['rollouts\' checks', drawn], ['the reference\'s checks', referenced]] as const) {
      if (!v) continue;
      out.info(`  ${what}: ${v.checked} records re-run by the validator, ${v.failed} failed`
        + `${v.flagged.length ? `; caught: ${v.flagged.map((p) => `…${p.slice(-6)}`).join(', ')}` : ''}`);
    }
    const rollouts = drawer ? { rollouts: { jobId: drawer.jobId, escrow: drawerEscrow, verification: drawn } } : {};
    const where = hosted ? `hosted ${model}` : 'a private job';
    const reference = base ? { reference: { verification: referenced, recorded: base.recorded } } : {};
    out.result({ task: task.name, where, jobId: dm.jobId, escrow, ...result, verification, ...rollouts, ...reference }, summary(result));
  } finally {
    const removeEnds = () => ends && rmSync(ends, { recursive: true, force: true });
    await inTurn([() => base?.close(), () => drawer?.close(), () => dm?.close(), () => access.close(), removeEnds]);
  }
}

/** Runs each in turn, whatever the one before threw; throws the first error after the last. */
async function inTurn(steps: (() => unknown)[]): Promise<void> {
  let first: { err: unknown } | null = null;
  for (const step of steps) {
    try {
      await step();
    } catch (err) {
      first ??= { err };
    }
  }
  if (first) throw first.err;
}
