import { randomUUID } from 'node:crypto';
import type { Libp2p } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { InvalidArgumentError, PlanInfeasibleError } from '../errors.ts';
import type { CausalLM } from '../models/index.ts';
import type { DialTarget, PeerRecord, StageAssignment } from '../p2p/index.ts';
import { type Device, layerCosts, plan, type StrategyName } from '../plan/index.ts';
import { DistributedJob, type JobStage } from './job.ts';
import { listWorkers } from './peers.ts';
import { type LoadProgress, RemoteStage } from './remote-stage.ts';
import { modelFromCheckpoint, modelInMemory, type UserModel } from './user-model.ts';
import { ResultInbox } from './result-inbox.ts';

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
   * four times its weights (activations come on top; leave room in --memory).
   */
  training?: boolean;
  /** Hashes of a checkpoint's chunks are cached here (default: defaultCacheDir(); null: not cached). */
  cacheDir?: string | null;
  /** Called as each section loads: which worker, bytes settled, sent and in all. */
  onProgress?: (stage: StageAssignment, progress: LoadProgress) => void;
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
  const source = typeof model === 'string' ? await modelFromCheckpoint(model, { keepEnds, cacheDir: options.cacheDir }) : modelInMemory(model);
  try {
    return await distributeSource(node, validator, source, options);
  } catch (err) {
    source.close();
    throw err;
  }
}

async function distributeSource(
  node: Libp2p,
  validator: string | DialTarget,
  source: UserModel,
  options: DistributeOptions,
): Promise<DistributedJob> {
  const workers = await listWorkers(node, typeof validator === 'string' ? multiaddr(validator) : validator);
  if (workers.length === 0) throw new PlanInfeasibleError('the validator knows no live workers');
  const replicas = options.replicas ?? 1;
  if (!Number.isInteger(replicas) || replicas < 1) throw new InvalidArgumentError(`replicas must be ≥ 1, got ${replicas}`);
  if (workers.length < replicas) throw new PlanInfeasibleError(`${replicas} replicas need at least ${replicas} workers; the validator knows ${workers.length}`);
  const perGroup = Math.floor(workers.length / replicas);
  const groups = Array.from({ length: replicas }, (_, j) => workers.slice(j * perGroup, (j + 1) * perGroup));
  const layerCount = source.config.layers;
  const keepEnds = (options.privacy ?? 'ends') === 'ends';
  const [first, last] = keepEnds ? [1, layerCount + 1] : [0, layerCount + 3];
  // a worker trains with gradients and two AdamW moments beside the weights
  const factor = options.training ? 4 : 1;
  const costs = layerCosts(source.layers).slice(first, last).map((c) => ({ ...c, bytes: factor * c.bytes }));
  const devices: Device[] = groups.map((group) => group.map((w) => {
    const { memoryBytes, memoryFreeBytes, gflops } = w.capabilities!;
    return { id: w.peerId, memoryBytes: memoryFreeBytes ?? memoryBytes, gflops };
  })).reduce((a, b) => a.map((d, i) => ({ ...d, memoryBytes: Math.min(d.memoryBytes, b[i].memoryBytes) })));
  const chosen = plan(options.strategy ?? 'layer-aware', costs, devices, { tokens: options.tokens ?? 1 });
  const jobId = randomUUID();
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
    const inbox = (options.routing ?? 'chain') === 'chain' ? await inboxFor(node) : null;
    const onProgress = options.onProgress ? (stage: JobStage, p: LoadProgress) => options.onProgress!(stage.where, p) : undefined;
    const job = new DistributedJob(node, jobId, source, chosen, sections, inbox, { keepEnds, onProgress });
    await job.load();
    return job;
  } catch (err) {
    await Promise.all(sections.flat().map((s) => s.remote.close()));
    throw err;
  }
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
