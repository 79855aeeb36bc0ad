import { randomUUID } from 'node:crypto';
import { basename, resolve } from 'node:path';
import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError, PlanInfeasibleError } from '../errors.ts';
import type { CausalLM } from '../models/index.ts';
import {
  type DialTarget, MAX_VALIDATORS, type PeerRecord, replannedJobId, type StageAssignment, validatorTarget, Validators,
} from '../p2p/index.ts';
import {
  type LayerCost, layerCosts, linkBetween, linkTable, measuredLinks, type Plan, plan,
  type PlanOptions, replan, type Replan, type StrategyName, type Swarm,
} from '../plan/index.ts';
import { configToHF, weightFormat } from '../models/index.ts';
import { type AdapterOption, blockFactorBytes, jobAdapter, withAdapter } from './job-adapter.ts';
import { placeOnHosts } from './hosted-base.ts';
import { findHosted } from './pull-ends.ts';
import { DistributedJob, type JobStage, type Placement } from './job.ts';
import { gatherLinks } from './links.ts';
import { listPeers, listWorkers } from './peers.ts';
import { DEFAULT_SAMPLE_RATE, JobVerifier, type VerifyOptions } from './verifier.ts';
import { type LoadProgress, RemoteStage } from './remote-stage.ts';
import { modelFromCheckpoint, modelInMemory, type UserModel } from './user-model.ts';
import { ResultInbox } from './result-inbox.ts';
import { jobPlanOptions, memoryFactor, surveyWorkers } from './survey.ts';

export interface DistributeOptions {
  strategy?: StrategyName;
  /** 'ends' (default): the user keeps the embedding, final norm and head; 'none': everything on workers. */
  privacy?: 'ends' | 'none';
  /** Tokens per step the plan optimises for (default 1: decoding). */
  tokens?: number;
  /**
   * 'chain' (default): hidden states go worker to worker and the last returns to the user;
   * 'relay': the user passes them between workers (one round trip per stage).
   */
  routing?: 'chain' | 'relay';
  /**
   * Copies of every section on different workers, for data-parallel training (default 1): the
   * workers are split into this many groups, the plan is made on the first, and each group
   * holds the same sections. Generation uses the first copy.
   */
  replicas?: number;
  /**
   * Plan for training: a worker then holds the section's gradients and AdamW's two moments too,
   * four times its weights, eight with verification on (activations come on top; leave room in --memory).
   */
  training?: boolean;
  /** Hashes of a checkpoint's chunks are cached here (default: defaultCacheDir(); null: not cached). */
  cacheDir?: string | null;
  /** Called as each section loads: which worker, bytes settled, sent and in all. */
  onProgress?: (stage: StageAssignment, progress: LoadProgress) => void;
  /**
   * Checking the workers: `redundancy` k runs each section on k workers and compares their
   * results (default 1); `sampleRate` p has the validator re-run that share of their records
   * (default DEFAULT_SAMPLE_RATE). A worker caught is flagged, excluded, and its work redone.
   */
  verify?: VerifyOptions;
  /** The model's name on the validator's dashboard (default: the checkpoint directory's name, or none). */
  name?: string;
  /**
   * Hold the model's matrices compact, as loadModel does (bf16, or int8/int4 blocks), on the user's ends and on every
   * worker (each packs its section once it has arrived). For a checkpoint directory, generation only (frozen). Checked
   * as any job: the validator re-runs sampled records with the compact weights the worker held (bit for bit on js,
   * within the format's tolerance on ort: ortTolerance), and redundant copies are compared the same way.
   */
  dtype?: 'f32' | 'bf16';
  quantize?: 'int8' | 'int4';
  /**
   * A LoRA adapter over the frozen model (compact too: QLoRA): new factors from a config (`{ r, alpha, targets, seed }`,
   * each layer's drawn as one process draws it) or a PEFT adapter folder. Every worker holds its section's factors
   * beside the base and trains only them; the user's ends are frozen (and adapted where targeted). From a checkpoint
   * directory. `saveAdapter(dir)` writes the trained adapter in PEFT's layout.
   */
  adapter?: AdapterOption;
  /**
   * Train the adapter over a model that hosts serve for everyone (`worker --host NAME=…`, in the same format as
   * `dtype`/`quantize` here), by its name (`NAME@HASHPREFIX` when several copies are hosted), instead of loading private
   * copies: the job's sections share the hosts' blocks with every other job and session on them, and only the adapter's
   * factors are sent. The model given (a checkpoint directory) must be the hosted one: the user runs its ends.
   */
  hosted?: string;
  /**
   * The least a request waits before its worker is taken for lost and replaced (default DEADLINE_FLOOR_MS, 10 s; longer
   * when the plan predicts a slow step). Raise it where workers are known to be slow (a loaded machine, browser tabs): a
   * worker that dies, closes or is cut off is still replaced at once, whatever its deadline.
   */
  deadlineFloorMs?: number;
}

/**
 * Plans `model` over the live workers of a validator (layer-aware by default), loads each
 * worker's section (hash-checked, only the chunks it lacks), and returns the distributed job:
 * a model that generates and trains across the workers. With privacy 'ends' the embedding and
 * head never leave this machine. The user plans; the validator only says who is alive.
 *
 * `model` may be a checkpoint directory instead of a loaded model: the user then loads only its
 * ends (nothing but the tokenizer with privacy 'none') and streams each worker's section from
 * the files, a few chunks at a time, so a model far larger than the user's memory can run.
 * @example
 * const dm = await distribute(node, validatorAddr, model)
 * const { tokens } = await dm.generate(promptIds, { maxNewTokens: 16 })
 * const trainer = await dm.trainer({ optimizer: { lr: 1e-3 }, totalSteps: 100, microBatches: 4, schedule: '1f1b' })
 * await trainer.step({ input, target })
 */
export async function distribute(
  node: Libp2p,
  validator: string | DialTarget,
  model: CausalLM | string,
  options: DistributeOptions = {},
): Promise<DistributedJob> {
  const keepEnds = (options.privacy ?? 'ends') === 'ends';
  const format = weightFormat(options);
  if (format) {
    if (typeof model !== 'string') throw new InvalidArgumentError('a compact job (dtype bf16, quantize) loads from a checkpoint directory, not from a model in memory');
    if (options.training && !options.adapter) {
      throw new InvalidArgumentError('a compact section is frozen: there is nothing to train in it; train an adapter over it (adapter: { r, alpha, targets })');
    }
  }
  if (options.adapter && typeof model !== 'string') throw new InvalidArgumentError('a job with an adapter loads from a checkpoint directory, not from a model in memory');
  if (options.hosted !== undefined) checkHostedJob(options);
  const floor = options.deadlineFloorMs;
  if (floor !== undefined && !(Number.isFinite(floor) && floor >= 0 && floor <= 2 ** 31 - 1)) {
    throw new InvalidArgumentError(`deadlineFloorMs must be a number of milliseconds in [0, ${2 ** 31 - 1}], not ${floor}`);
  }
  const adapter = options.adapter === undefined ? null : jobAdapter(options.adapter);
  if (adapter && options.hosted !== undefined) {
    const [name, hash] = options.hosted.split('@', 2);
    adapter.base = (await findHosted(node, validatorTarget(validator), name, hash)).hash;
  }
  const loaded = typeof model === 'string' ? await modelFromCheckpoint(model, { keepEnds, cacheDir: options.cacheDir, format }) : modelInMemory(model);
  let source: UserModel;
  try {
    source = adapter ? withAdapter(loaded, adapter) : loaded;
  } catch (err) {
    loaded.close();
    throw err;
  }
  try {
    const name = options.name ?? (typeof model === 'string' ? basename(resolve(model)) : undefined);
    return await distributeSource(node, validatorTarget(validator), source, { ...options, ...(name === undefined ? {} : { name }) });
  } catch (err) {
    source.close();
    throw err;
  }
}

/** What a job over hosted blocks cannot be: it trains an adapter, with the user holding the ends, one copy of each section. */
function checkHostedJob(options: DistributeOptions): void {
  if (!options.adapter) throw new InvalidArgumentError('a job over a hosted model trains an adapter on it (its blocks are frozen and shared): give adapter; to run the model, open a HostedModel');
  if ((options.privacy ?? 'ends') !== 'ends') throw new InvalidArgumentError('a job over a hosted model keeps its ends (privacy \'ends\'): the hosts hold only blocks');
  if ((options.replicas ?? 1) > 1 || (options.verify?.redundancy ?? 1) > 1) {
    throw new InvalidArgumentError('a job over a hosted model runs one copy of each section (no replicas or redundancy yet)');
  }
}

async function distributeSource(
  node: Libp2p,
  validatorAddr: string | DialTarget,
  source: UserModel,
  options: DistributeOptions,
): Promise<DistributedJob> {
  const validator = validatorTarget(validatorAddr);
  const redundancy = options.verify?.redundancy ?? 1;
  if ((options.replicas ?? 1) > 1 && redundancy > 1) throw new InvalidArgumentError('redundancy with replicas is not supported yet: use one or the other');
  if (redundancy > 1 && options.privacy === 'none' && source.config.tieWordEmbeddings) {
    throw new InvalidArgumentError('redundancy with privacy \'none\' on a model whose head is tied to its embedding is not supported yet: keep the ends (privacy \'ends\')');
  }
  const keepEnds = (options.privacy ?? 'ends') === 'ends';
  const hosted = options.hosted;
  const placeJob = (avoid?: ReadonlySet<string>, jobId?: string) => (hosted === undefined
    ? place(node, validator, source, options, avoid, jobId)
    : placeOnHosts(node, validator, source, hosted, avoid, jobId));
  const first = await placeJob();
  // planned again (a worker caught or lost): a new id, so that its records are not the old ones', that names the first, so
  // that the first's escrow pays them (ledger's escrowJobOf)
  let again = 0;
  let job: DistributedJob | null = null;
  try {
    // the validators that may re-run the job's work: every one its validator lists (itself first), as many as a load names
    const listed = (await listPeers(node, validator)).filter((p) => p.roles.includes('validator')).map((p) => p.peerId);
    const validators = [...new Set([...listed, ...(validator instanceof Validators ? validator.ids() : [])])];
    if (validators.length === 0) throw new PlanInfeasibleError('the validator did not name itself in its status');
    const verifier = new JobVerifier(node, validator, validators.slice(0, MAX_VALIDATORS), options.verify ?? {}, () => ({
      jobId: job!.jobId,
      config: configToHF(source.config),
      optimizer: job!.optimizerSettings ?? { lr: 0 },
      ...(source.adapter ? { adapter: source.adapter.wire } : {}),
      // a job over a hosted model: the base its hosts hand over to an audit is checked against that model
      ...(source.adapter?.base && hosted !== undefined
        ? { base: { name: hosted.split('@', 1)[0], hash: source.adapter.base, format: source.format ?? 'f32' } }
        : {}),
      // factors set on a job that does not train (setAdapter): a host must compute with them
      ...(source.adapter ? { factorsOf: (range: readonly [number, number]) => job!.factorsOf(range) } : {}),
    }));
    const inbox = (options.routing ?? 'chain') === 'chain' ? await inboxFor(node) : null;
    const onProgress = options.onProgress ? (stage: JobStage, p: LoadProgress) => options.onProgress!(stage.where, p) : undefined;
    job = new DistributedJob(node, first.jobId, source, first.plan, first.sections, inbox, {
      keepEnds, onProgress, verifier, validator, tokens: options.tokens, name: options.name, deadlineFloorMs: options.deadlineFloorMs,
      relocate: (avoid) => placeJob(new Set([...verifier.excluded, ...(avoid ?? [])]), replannedJobId(first.jobId, ++again)),
      // a job over hosts takes the route they offer: it moves when one fails, not for a better plan
      ...(hosted === undefined
        ? {
            propose: (current: Plan, avoid: ReadonlySet<string>) =>
              proposeReplan(node, validator, source, options, current, new Set([...verifier.excluded, ...avoid])),
          }
        : {}),
    });
    await job.load();
    return job;
  } catch (err) {
    await Promise.all(first.sections.flat().map((s) => s.remote.close()));
    throw err;
  }
}

/** What a plan is made over: the workers, the model's cuttable layers, the devices and links. */
interface Survey {
  /** Disjoint groups of workers, one per copy of the sections; the plan is made on the first. */
  groups: PeerRecord[][];
  /** The model's layers the workers take (the user's ends left out), as the planner weighs them. */
  costs: LayerCost[];
  /** Index of costs[0] among the model's layers. */
  first: number;
  swarm: Swarm;
  options: PlanOptions;
}

/**
 * The live workers the validator has not flagged (nor `excluded`), split into groups for the
 * copies, with the links between them and to this user measured (see links.ts).
 */
async function survey(
  node: Libp2p,
  validator: DialTarget,
  source: UserModel,
  options: DistributeOptions,
  excluded?: ReadonlySet<string>,
): Promise<Survey> {
  const trusted = (await listWorkers(node, validator)).filter((w) => !excluded?.has(w.peerId));
  if (trusted.length === 0) throw new PlanInfeasibleError('the validator knows no live workers it trusts');
  const copies = Math.max(options.replicas ?? 1, options.verify?.redundancy ?? 1);
  const { groups, devices } = surveyWorkers(trusted, source.config.layers, copies);
  const layerCount = source.config.layers;
  const keepEnds = (options.privacy ?? 'ends') === 'ends';
  const [first, last] = keepEnds ? [1, layerCount + 1] : [0, layerCount + 3];
  const verifying = (options.verify?.sampleRate ?? DEFAULT_SAMPLE_RATE) > 0 || (options.verify?.redundancy ?? 1) > 1;
  const factor = memoryFactor(options.training === true, verifying);
  const all = layerCosts(source.layers);
  // an adapter job trains only the factors: the frozen base is held once, the factors with their gradients and moments
  const perBlock = source.adapter ? blockFactorBytes(source.config, source.adapter.config) : 0;
  const costs = all.slice(first, last).map((c, i) => {
    if (!source.adapter) return { ...c, bytes: factor * c.bytes };
    return { ...c, bytes: c.bytes + (source.layers[first + i].kind === 'block' ? (factor - 1) * perBlock : 0) };
  });
  const links = linkTable(await gatherLinks(node, groups[0]));
  const planOptions = jobPlanOptions({
    user: node.peerId.toString(), inputBytesPerToken: keepEnds ? all[0].activationBytesPerToken : 4, training: options.training === true,
    tokens: options.tokens, routing: options.routing,
  });
  return { groups, costs, first, swarm: { devices, links }, options: planOptions };
}

/** The swarm each plan was made on, so that a later re-plan can say what changed. */
const plannedOn = new WeakMap<Plan, Swarm>();

/** The swarm a plan was made on: its devices and the links measured among them (undefined: distribute did not make it). */
export function plannedSwarm(planned: Plan): Swarm | undefined {
  return plannedOn.get(planned);
}

/**
 * The links between a plan's consecutive workers as the plan was made over them (round trip in ms, Mbit/s), each as
 * measured; a pair never measured is left out (the planner took its defaults). A hop through a relay (a worker behind a
 * NAT that WebRTC cannot get through) shows here as the slow one.
 */
export function planLinks(planned: Plan): { from: string; to: string; rttMs: number; mbps: number }[] {
  const links = plannedOn.get(planned)?.links;
  if (!links) return [];
  return planned.stages.slice(1).flatMap((s, i) => {
    const from = planned.stages[i].device;
    const e = linkBetween(links, from, s.device);
    return e ? [{ from, to: s.device, rttMs: e.latency * 2000, mbps: (e.bandwidth * 8) / 1e6 }] : [];
  });
}

/**
 * Plans the model over the live workers the validator has not flagged (over the links measured
 * between them and to this user), and opens a job on each chosen worker: replicas (or
 * redundant copies) on disjoint groups of workers.
 */
async function place(
  node: Libp2p,
  validator: DialTarget,
  source: UserModel,
  options: DistributeOptions,
  excluded?: ReadonlySet<string>,
  jobId: string = randomUUID(),
): Promise<Placement> {
  const { groups, costs, first, swarm, options: planOptions } = await survey(node, validator, source, options, excluded);
  const chosen = plan(options.strategy ?? 'layer-aware', costs, swarm.devices, { ...planOptions, links: measuredLinks(swarm.links) });
  plannedOn.set(chosen, swarm);
  const placed = chosen.stages.map((s) => {
    const index = groups[0].findIndex((w) => w.peerId === s.device);
    return groups.map((g, replica) => ({ record: g[index], start: s.start + first, end: s.end + first, replica }));
  });
  const sections: JobStage[][] = [];
  try {
    for (const copies of placed) {
      const opened: JobStage[] = [];
      sections.push(opened);
      for (const c of copies) {
        const where = { peerId: c.record.peerId, addrs: c.record.addrs, start: c.start, end: c.end, replica: c.replica };
        opened.push({ where, remote: await RemoteStage.open(node, targetOf(c.record), jobId) });
      }
    }
    return { jobId, plan: chosen, sections };
  } catch (err) {
    await Promise.all(sections.flat().map((s) => s.remote.close()));
    throw err;
  }
}

/**
 * Whether the job should be planned again, between steps or sessions: the workers and links
 * are surveyed as for a new plan (less `avoid`), and a new plan is proposed when it predicts a
 * step faster than `current` does under today's links by more than REPLAN_GAIN (a worker
 * joined or left, a link slowed or sped up). The reason names the change and both predictions;
 * null when the current plan stays. Nothing is opened on any worker: the job re-places itself
 * (its `relocate`) if it takes the proposal.
 * @example
 * const r = await proposeReplan(node, validator, source, options, job.plan)
 * if (r) { log.info('replan', { reason: r.reason }); await job.relocate() }
 */
export async function proposeReplan(
  node: Libp2p,
  validatorAddr: string | DialTarget,
  source: UserModel,
  options: DistributeOptions,
  current: Plan,
  avoid?: ReadonlySet<string>,
): Promise<Replan | null> {
  const validator = validatorTarget(validatorAddr);
  const { costs, swarm, options: planOptions } = await survey(node, validator, source, options, avoid);
  return replan({ strategy: options.strategy ?? 'layer-aware', layers: costs, current, now: swarm, before: plannedOn.get(current), options: planOptions });
}

/** How to reach a peer: its id and every address it announced. */
function targetOf(record: PeerRecord) {
  return { peerId: record.peerId, addrs: record.addrs };
}

const inboxes = new WeakMap<Libp2p, Promise<ResultInbox>>();

/** One result inbox per user node (the protocol handler is registered once). */
function inboxFor(node: Libp2p): Promise<ResultInbox> {
  let inbox = inboxes.get(node);
  if (!inbox) {
    inbox = ResultInbox.start(node);
    inboxes.set(node, inbox);
  }
  return inbox;
}
