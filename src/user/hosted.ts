import { randomUUID } from 'node:crypto';
import type { Libp2p } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { InvalidArgumentError, PlanInfeasibleError } from '../errors.ts';
import {
  type CausalLM, defaultPositions, type ForwardOptions, generateWith, type GenerateOptions, loadModel, type StepModel,
} from '../models/index.ts';
import { type DialTarget, type HostedModelEntry, hostedJobId, type PeerRecord, parseModelsAnswer, request } from '../p2p/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { listPeers } from './peers.ts';
import { RemoteStage } from './remote-stage.ts';

/** One page of the validator's index of hosted models (`tensorlink models`). */
export async function listModels(node: Libp2p, validator: DialTarget, page = 0): Promise<{ models: HostedModelEntry[]; next?: number }> {
  return parseModelsAnswer(await request(node, validator, { type: 'models', page }));
}

/** One hop of a route over hosts: who serves which blocks (from 0, inclusive). */
export interface RouteHop {
  peerId: string;
  addrs: string[];
  layers: [number, number];
}

/** A host short of KV cache for a session of this many tokens costs this much more (in hops) on a route. */
const SHORT_OF_CACHE_PENALTY = 4;

/**
 * The route over a model's online hosts that covers every block, in order, with the fewest predicted costs: each hop
 * costs one (a round trip) plus its blocks over the host's speed, and a host with fewer free KV-cache tokens than
 * `tokens` costs SHORT_OF_CACHE_PENALTY more. A shortest path over block boundaries (Dijkstra); null when no route
 * covers every block. `avoid`: hosts not to use (one that failed).
 */
export function routeOver(
  model: HostedModelEntry, peers: readonly PeerRecord[], tokens = 0, avoid: ReadonlySet<string> = new Set(),
): RouteHop[] | null {
  const byId = new Map(peers.map((p) => [p.peerId, p]));
  const edges: { from: number; to: number; cost: number; hop: RouteHop }[] = [];
  for (const h of model.hosts) {
    const peer = byId.get(h.peerId);
    if (h.state !== 'online' || !peer || avoid.has(h.peerId)) continue;
    const blocks = h.layers[1] - h.layers[0] + 1;
    const speed = Math.max(1, peer.capabilities?.gflops ?? 1);
    const short = h.freeTokens !== undefined && h.freeTokens < tokens ? SHORT_OF_CACHE_PENALTY : 0;
    const hop = { peerId: h.peerId, addrs: peer.addrs, layers: h.layers };
    edges.push({ from: h.layers[0], to: h.layers[1] + 1, cost: 1 + blocks / speed + short, hop });
  }
  const best = new Array<number>(model.layers + 1).fill(Number.POSITIVE_INFINITY);
  const via = new Array<{ at: number; hop: RouteHop } | null>(model.layers + 1).fill(null);
  best[0] = 0;
  // boundaries only move forward: one pass in order is Dijkstra on this DAG
  for (let at = 0; at < model.layers; at++) {
    if (!Number.isFinite(best[at])) continue;
    for (const e of edges) {
      if (e.from !== at || e.to > model.layers) continue;
      if (best[at] + e.cost < best[e.to]) {
        best[e.to] = best[at] + e.cost;
        via[e.to] = { at, hop: e.hop };
      }
    }
  }
  if (!Number.isFinite(best[model.layers])) return null;
  const route: RouteHop[] = [];
  for (let at = model.layers; at > 0; at = via[at]!.at) route.unshift(via[at]!.hop);
  return route;
}

/**
 * A model the swarm hosts, used by name: the user holds only its ends (embedding, final norm, head) and routes each
 * session over hosts that cover every block. Many users' sessions share the hosts' one loaded copy; each session's
 * KV cache lives on its hosts, bound to this user's peer.
 * @example
 * const m = await HostedModel.open(node, validator, 'llama3', { ends: 'models/llama3' })
 * const { tokens } = await m.generate(promptIds, { maxNewTokens: 16 })
 */
export class HostedModel {
  private readonly stages = new Map<string, RemoteStage>();

  private constructor(
    private readonly node: Libp2p,
    private readonly validator: DialTarget,
    readonly entry: HostedModelEntry,
    /** The user's ends. */
    readonly ends: CausalLM,
  ) {}

  /**
   * Finds `name` in the validator's index (`hash`: that copy, when several are hosted under the name) and takes its
   * ends: a loaded model holding them, or a checkpoint directory or GGUF file to load them from.
   */
  static async open(
    node: Libp2p, validatorAddr: string | DialTarget, name: string, options: { ends: CausalLM | string; hash?: string },
  ): Promise<HostedModel> {
    const validator = typeof validatorAddr === 'string' ? multiaddr(validatorAddr) : validatorAddr;
    const entry = await findModel(node, validator, name, options.hash);
    const ends = typeof options.ends === 'string' ? await loadModel(options.ends, { part: 'ends' }) : options.ends;
    if (ends.config.layers !== entry.layers) {
      throw new InvalidArgumentError(`the ends are of a model with ${ends.config.layers} blocks; '${name}' has ${entry.layers}`);
    }
    return new HostedModel(node, validator, entry, ends);
  }

  /** Generates from `prompt` over a fresh route (see GenerateOptions); the session is closed on every host after. */
  async generate(prompt: number[], options: GenerateOptions = {}): Promise<{ tokens: number[] }> {
    const [tokens] = await this.generateBatch([prompt], options);
    return { tokens };
  }

  async generateBatch(prompts: number[][], options: GenerateOptions = {}): Promise<number[][]> {
    const peers = await listPeers(this.node, this.validator);
    const entry = await findModel(this.node, this.validator, this.entry.name, this.entry.hash);
    const tokens = Math.max(...prompts.map((p) => p.length)) + (options.maxNewTokens ?? 32);
    const route = routeOver(entry, peers, tokens);
    if (!route) throw new PlanInfeasibleError(`no online hosts cover every block of '${entry.name}' now`);
    const sessionId = randomUUID();
    const hops = await Promise.all(route.map(async (hop) => ({ hop, stage: await this.stageFor(hop, entry) })));
    try {
      return await generateWith(this.stepModel(sessionId, hops.map((h) => h.stage)), prompts, options);
    } finally {
      await Promise.all(hops.map(({ stage }) => stage.closeSession(sessionId).catch(() => {})));
    }
  }

  /** A step of a session: the user's embedding, each host's blocks in turn (each answers its sender), the user's head. */
  private stepModel(sessionId: string, stages: RemoteStage[]): StepModel {
    const layers = this.ends.layers;
    const [embed, norm, head] = [layers[0], layers[layers.length - 2], layers[layers.length - 1]];
    let past = 0;
    return {
      maxPositions: this.ends.config.maxPositions,
      eosTokenId: this.ends.tokenizer?.eosTokenId ?? this.ends.config.eosTokenId ?? null,
      step: async (ids: Tensor, options: ForwardOptions) => {
        const [b, t] = ids.shape;
        const positions = options.positions ?? defaultPositions(b, t, past);
        const keyMask = options.keyMask ?? null;
        const ctx = { positions, keyMask, cache: null };
        let x = noGrad(() => embed.forward(ids, ctx));
        for (const stage of stages) x = await stage.forward(sessionId, x, positions, keyMask);
        past += t;
        return noGrad(() => head.forward(norm.forward(x, ctx), ctx));
      },
    };
  }

  private async stageFor(hop: RouteHop, entry: HostedModelEntry): Promise<RemoteStage> {
    const jobId = hostedJobId({ name: entry.name, hash: entry.hash, layers: hop.layers });
    const key = `${hop.peerId}/${jobId}`;
    const open = this.stages.get(key);
    if (open?.open) return open;
    const stage = await RemoteStage.attach(this.node, { peerId: hop.peerId, addrs: hop.addrs }, jobId);
    this.stages.set(key, stage);
    return stage;
  }

  async close(): Promise<void> {
    await Promise.all([...this.stages.values()].map((s) => s.close()));
    this.stages.clear();
  }
}

async function findModel(node: Libp2p, validator: DialTarget, name: string, hash?: string): Promise<HostedModelEntry> {
  const found: HostedModelEntry[] = [];
  for (let page: number | undefined = 0; page !== undefined;) {
    const answer: { models: HostedModelEntry[]; next?: number } = await listModels(node, validator, page);
    found.push(...answer.models.filter((m) => m.name === name && (hash === undefined || m.hash === hash)));
    page = answer.next;
  }
  if (found.length === 0) throw new PlanInfeasibleError(`no host announces a model named '${name}'${hash ? ` with hash ${hash.slice(0, 12)}…` : ''}`);
  if (found.length > 1) {
    throw new InvalidArgumentError(`'${name}' is hosted in ${found.length} different copies (hashes ${found.map((m) => m.hash.slice(0, 12)).join(', ')}): name one by its hash`);
  }
  return found[0];
}
