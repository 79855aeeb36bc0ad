import { randomUUID } from 'node:crypto';
import type { Libp2p } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { PlanInfeasibleError } from '../errors.ts';
import { type CausalLM, configToHF, createModel, type GenerateOptions, generateWith, type StepModel } from '../models/index.ts';
import { type Device, layerCosts, type Plan, plan, type StrategyName } from '../plan/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { request } from './control.ts';
import { RemoteStage, ResultInbox } from './remote-stage.ts';
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
}

/** A model split across workers; the user holds its ends. */
export interface DistributedModel {
  readonly plan: Plan;
  /** Which worker runs which layers (global layer indices, end exclusive). */
  readonly assignment: { peerId: string; start: number; end: number }[];
  generate(prompt: number[], options?: GenerateOptions): Promise<{ tokens: number[] }>;
  generateBatch(prompts: number[][], options?: GenerateOptions): Promise<{ tokens: number[][] }>;
  close(): Promise<void>;
}

/** The weights of layers [start, end) of a whole model, under their checkpoint names. */
function sectionWeights(model: CausalLM, range: [number, number]): Map<string, Tensor> {
  const state = model.hfStateDict();
  const names = [...createModel(model.config, { section: range }).hfStateDict().keys()];
  return new Map(names.map((k) => [k, state.get(k)!]));
}

function subset(model: CausalLM, range: [number, number]): CausalLM {
  const part = createModel(model.config, { section: range });
  part.loadStateDict(sectionWeights(model, range));
  return part;
}

/**
 * Plans `model` over the live workers of a validator (layer-aware by default), loads each
 * worker's section (hash-checked), and returns a model that generates across them. With
 * privacy 'ends' the embedding and head never leave this machine.
 * @example
 * const dm = await distribute(node, validatorAddr, model)
 * const { tokens } = await dm.generate(promptIds, { maxNewTokens: 16 })
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
  const total = model.config.layers + 3;
  const keepEnds = (options.privacy ?? 'ends') === 'ends';
  const [first, last] = keepEnds ? [1, model.config.layers + 1] : [0, total];
  const costs = layerCosts(model.layers).slice(first, last);
  const devices: Device[] = workers.map((w) => ({
    id: w.peerId,
    memoryBytes: w.capabilities!.memoryBytes,
    gflops: w.capabilities!.gflops,
  }));
  const chosen = plan(options.strategy ?? 'layer-aware', costs, devices, { tokens: options.tokens ?? 1 });
  const jobId = randomUUID();
  const assignment = chosen.stages.map((s) => ({ peerId: s.device, start: s.start + first, end: s.end + first }));
  const stages: RemoteStage[] = [];
  const addrs: string[] = [];
  const routing = options.routing ?? 'chain';
  try {
    for (const [i, a] of assignment.entries()) {
      const record = workers.find((w) => w.peerId === a.peerId)!;
      const addr = record.addrs.find((x) => x.includes('/p2p/')) ?? `${record.addrs[0]}/p2p/${record.peerId}`;
      addrs.push(addr);
      const stage = await RemoteStage.open(node, multiaddr(addr), jobId);
      stages.push(stage);
      const upstream = routing === 'chain' && i > 0 ? assignment[i - 1].peerId : undefined;
      await stage.load(configToHF(model.config), [a.start, a.end], sectionWeights(model, [a.start, a.end]), upstream);
    }
  } catch (err) {
    await Promise.all(stages.map((s) => s.close()));
    throw err;
  }
  const inbox = routing === 'chain' ? await inboxFor(node) : null;
  const head = keepEnds ? subset(model, [model.config.layers + 1, total]) : null;
  const embed = keepEnds ? subset(model, [0, 1]) : null;
  const stepModel = (sessionId: string): StepModel => ({
    maxPositions: model.config.maxPositions,
    eosTokenId: model.tokenizer?.eosTokenId ?? model.config.eosTokenId ?? null,
    step: async (ids, opts) => {
      const positions = opts.positions!;
      const keyMask = opts.keyMask ?? null;
      let x: Tensor = embed ? noGrad(() => embed.forward(ids, { positions })) : ids;
      if (inbox) {
        const { requestId, result } = inbox.expect();
        await stages[0].forwardChained(sessionId, keyMask ? [x, positions, keyMask] : [x, positions], addrs.slice(1), {
          addr: inbox.addr,
          requestId,
        });
        x = await result;
      } else {
        for (const s of stages) x = await s.forward(sessionId, x, positions, keyMask);
      }
      return head ? noGrad(() => head.forward(x, { positions })) : x;
    },
  });
  const run = async (prompts: number[][], o: GenerateOptions) => {
    const session = randomUUID();
    try {
      return await generateWith(stepModel(session), prompts, o);
    } finally {
      await Promise.all(stages.map((s) => s.closeSession(session).catch(() => {})));
    }
  };
  return {
    plan: chosen,
    assignment,
    generate: async (prompt, o = {}) => ({ tokens: (await run([prompt], o))[0] }),
    generateBatch: async (prompts, o = {}) => ({ tokens: await run(prompts, o) }),
    close: async () => {
      await Promise.all(stages.map((s) => s.close()));
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
