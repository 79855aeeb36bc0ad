import { randomUUID } from 'node:crypto';
import type { Libp2p } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { InvalidArgumentError, PlanInfeasibleError } from '../errors.ts';
import { type CausalLM, configToHF, defaultPositions, type GenerateOptions, generateWith, runLayers, type StepModel } from '../models/index.ts';
import { type PipelineStage, PipelineTrainer, type ScheduleName, sectionWeights, userEnds } from '../pipeline/index.ts';
import { type Device, layerCosts, type Plan, plan, type StrategyName } from '../plan/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { request } from './control.ts';
import { RemoteStage, ResultInbox } from './remote-stage.ts';
import { RemoteTrainStage } from './remote-train.ts';
import type { PeerRecord } from './vocabulary.ts';

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
}

export interface DistributedTrainerOptions {
  /** AdamW on every holder of parameters (the only optimizer so far). */
  optimizer: { name?: 'adamw'; lr: number; weightDecay?: number };
  /** Steps the learning-rate schedule spans (warm-up, then cosine to 10%). */
  totalSteps: number;
  warmupSteps?: number;
  /** Micro-batches per step (default: one per replica). */
  microBatches?: number;
  schedule?: ScheduleName;
  /** Must equal the replicas the model was distributed with, if given. */
  replicas?: number;
  /** Clip the global gradient norm over all stages (default 1; 0 disables). */
  clipNorm?: number;
  /** Workers recompute activations in the backward instead of keeping them. */
  recompute?: boolean;
}

/** A model split across workers; the user holds its ends. */
export interface DistributedModel {
  readonly plan: Plan;
  /** Which worker runs which layers (global layer indices, end exclusive), for each replica. */
  readonly assignment: { peerId: string; start: number; end: number; replica: number }[];
  generate(prompt: number[], options?: GenerateOptions): Promise<{ tokens: number[] }>;
  generateBatch(prompts: number[][], options?: GenerateOptions): Promise<{ tokens: number[][] }>;
  /** The logits [B, T, V] of token ids [B, T] (int32), computed across the workers in a session of its own. */
  logits(ids: Tensor): Promise<Tensor>;
  /** Sets up training on the workers (their AdamW, the reductions among replicas) and returns the trainer. */
  trainer(options: DistributedTrainerOptions): Promise<PipelineTrainer>;
  /** AdamW's state of every parameter that has taken a step, from its first holder: for checkpoints. */
  optimizerState(): Promise<Map<string, { moments: Tensor; step: number }>>;
  /** Gives every holder (replicas too) its parameters' optimizer state: resuming from a checkpoint. */
  setOptimizerState(state: Map<string, { moments: Tensor; step: number }>): Promise<void>;
  /** Brings the workers' current weights into the user's model (to save it, or to run it alone) and returns it. */
  pull(): Promise<CausalLM>;
  /** Ends the job: every worker frees its section, caches and training state. */
  close(): Promise<void>;
}

/** A peer's dialable address (with its peer id) from its record. */
export function addressOf(record: PeerRecord): string {
  return record.addrs.find((x) => x.includes('/p2p/')) ?? `${record.addrs[0]}/p2p/${record.peerId}`;
}

/**
 * Plans `model` over the live workers of a validator (layer-aware by default), loads each
 * worker's section (hash-checked), and returns a model that generates and trains across them.
 * With privacy 'ends' the embedding and head never leave this machine.
 * @example
 * const dm = await distribute(node, validatorAddr, model)
 * const { tokens } = await dm.generate(promptIds, { maxNewTokens: 16 })
 * const trainer = await dm.trainer({ optimizer: { lr: 1e-3 }, totalSteps: 100, microBatches: 4, schedule: '1f1b' })
 * await trainer.step({ input, target })
 */
export async function distribute(
  node: Libp2p,
  validatorAddr: string,
  model: CausalLM,
  options: DistributeOptions = {},
): Promise<DistributedModel> {
  const status = await request(node, multiaddr(validatorAddr), { type: 'status' });
  const workers = (status.peers as PeerRecord[]).filter((p) => p.roles.includes('worker') && p.capabilities);
  if (workers.length === 0) throw new PlanInfeasibleError('the validator knows no live workers');
  const replicas = options.replicas ?? 1;
  if (!Number.isInteger(replicas) || replicas < 1) throw new InvalidArgumentError(`replicas must be ≥ 1, got ${replicas}`);
  if (workers.length < replicas) throw new PlanInfeasibleError(`${replicas} replicas need at least ${replicas} workers; the validator knows ${workers.length}`);
  const perGroup = Math.floor(workers.length / replicas);
  const groups = Array.from({ length: replicas }, (_, j) => workers.slice(j * perGroup, (j + 1) * perGroup));
  const layerCount = model.config.layers;
  const total = layerCount + 3;
  const keepEnds = (options.privacy ?? 'ends') === 'ends';
  const [first, last] = keepEnds ? [1, layerCount + 1] : [0, total];
  const costs = layerCosts(model.layers).slice(first, last);
  const devices: Device[] = groups[0].map((w) => {
    const { memoryBytes, gflops } = w.capabilities!;
    return { id: w.peerId, memoryBytes, gflops };
  });
  const chosen = plan(options.strategy ?? 'layer-aware', costs, devices, { tokens: options.tokens ?? 1 });
  const jobId = randomUUID();
  const placed = chosen.stages.map((s) => {
    const index = groups[0].findIndex((w) => w.peerId === s.device);
    return groups.map((g, replica) => ({ record: g[index], start: s.start + first, end: s.end + first, replica }));
  });
  const assignment = placed.flat().map((p) => ({ peerId: p.record.peerId, start: p.start, end: p.end, replica: p.replica }));
  const stages: RemoteStage[][] = placed.map(() => []);
  const routing = options.routing ?? 'chain';
  try {
    for (const [i, copies] of placed.entries()) {
      for (const c of copies) {
        const stage = await RemoteStage.open(node, multiaddr(addressOf(c.record)), jobId);
        stages[i].push(stage);
        // generation runs on the first copy; its chain passes activations worker to worker
        const upstream = routing === 'chain' && i > 0 && c.replica === 0 ? placed[i - 1][0].record.peerId : undefined;
        await stage.load(configToHF(model.config), [c.start, c.end], sectionWeights(model, [c.start, c.end]), upstream);
      }
    }
  } catch (err) {
    await Promise.all(stages.flat().map((s) => s.close()));
    throw err;
  }
  const addrs = placed.map((copies) => addressOf(copies[0].record));
  const inbox = routing === 'chain' ? await inboxFor(node) : null;
  // the user's ends run on its own model's layers: training updates them in place
  const maxPositions = model.config.maxPositions;
  const runEnd = (range: [number, number], x: Tensor, positions: Tensor) =>
    noGrad(() => runLayers(model.layers.slice(range[0], range[1]), x, { positions }, maxPositions));
  const stepModel = (sessionId: string): StepModel => ({
    maxPositions,
    eosTokenId: model.tokenizer?.eosTokenId ?? model.config.eosTokenId ?? null,
    step: async (ids, opts) => {
      const positions = opts.positions!;
      const keyMask = opts.keyMask ?? null;
      let x: Tensor = keepEnds ? runEnd([0, 1], ids, positions) : ids;
      if (inbox) {
        const { requestId, result } = inbox.expect();
        await stages[0][0].forwardChained(sessionId, keyMask ? [x, positions, keyMask] : [x, positions], addrs.slice(1), {
          addr: inbox.addr,
          requestId,
        });
        x = await result;
      } else {
        for (const s of stages) x = await s[0].forward(sessionId, x, positions, keyMask);
      }
      return keepEnds ? runEnd([layerCount + 1, total], x, positions) : x;
    },
  });
  const run = async (prompts: number[][], o: GenerateOptions) => {
    const session = randomUUID();
    try {
      return await generateWith(stepModel(session), prompts, o);
    } finally {
      await Promise.all(stages.map((s) => s[0].closeSession(session).catch(() => {})));
    }
  };
  let training: RemoteTrainStage[][] | null = null;
  let pipeline: PipelineTrainer | null = null;
  const handles = () => {
    if (!pipeline) throw new InvalidArgumentError('this distributed model has no trainer yet: call trainer() first');
    return pipeline.stages.flatMap((s) => s.replicas);
  };
  return {
    plan: chosen,
    assignment,
    generate: async (prompt, o = {}) => ({ tokens: (await run([prompt], o))[0] }),
    generateBatch: async (prompts, o = {}) => ({ tokens: await run(prompts, o) }),
    logits: async (ids) => {
      if (ids.dtype !== 'int32' || ids.ndim !== 2) throw new InvalidArgumentError(`logits takes int32 ids [batch, time], got ${ids.dtype} [${ids.shape}]`);
      const session = randomUUID();
      try {
        return await stepModel(session).step(ids, { positions: defaultPositions(ids.shape[0], ids.shape[1], 0), keyMask: null });
      } finally {
        await Promise.all(stages.map((s) => s[0].closeSession(session).catch(() => {})));
      }
    },
    trainer: async (o) => {
      if (o.replicas !== undefined && o.replicas !== replicas) {
        throw new InvalidArgumentError(`the model was distributed with ${replicas} replica(s), the trainer asks for ${o.replicas}: pass replicas to distribute()`);
      }
      if (training) throw new InvalidArgumentError('this distributed model already has a trainer');
      const executor = { lr: o.optimizer.lr, weightDecay: o.optimizer.weightDecay, recompute: o.recompute };
      const peers = assignment.map((a) => a.peerId);
      const handles = placed.map((copies, i) =>
        copies.map((c, j) => new RemoteTrainStage(stages[i][j], addressOf(c.record), c.record.peerId, `worker ${c.record.peerId}, layers ${c.start}–${c.end - 1}`)));
      await Promise.all(handles.flat().map((h) => h.setup({ ...executor, peers })));
      training = handles;
      const middle: PipelineStage[] = handles.map((hs) => ({ replicas: hs }));
      const ends = keepEnds ? userEnds(model, executor) : null;
      pipeline = new PipelineTrainer(ends ? [ends.first, ...middle, ends.last] : middle, {
        lr: o.optimizer.lr,
        totalSteps: o.totalSteps,
        warmupSteps: o.warmupSteps,
        clipNorm: o.clipNorm,
        microBatches: o.microBatches ?? replicas,
        schedule: o.schedule,
      });
      return pipeline;
    },
    optimizerState: async () => {
      const out = new Map<string, { moments: Tensor; step: number }>();
      for (const h of handles()) for (const [n, s] of await h.optimizerState()) if (!out.has(n)) out.set(n, s);
      return out;
    },
    setOptimizerState: async (state) => {
      await Promise.all(handles().map((h) => h.setOptimizerState(state)));
    },
    pull: async () => {
      for (const copies of training ?? []) model.loadStateDict(await copies[0].weights(), { strict: false });
      return model;
    },
    close: async () => {
      await Promise.all(stages.flat().map((s) => s.close()));
    },
  };
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
