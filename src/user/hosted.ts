import type { Libp2p } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { InvalidArgumentError, PlanInfeasibleError, VerificationError } from '../errors.ts';
import {
  type CausalLM, configToHF, defaultPositions, type ForwardOptions, generateWith, type GenerateOptions, loadModel, type StepModel,
} from '../models/index.ts';
import {
  type DialTarget, type HostedModelEntry, hostedJobId, type PeerRecord, parseModelsAnswer, request, TRAIN_REQUEST_TIMEOUT_MS,
} from '../p2p/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { HostedSession, type RouteHop, type SessionRouter } from './hosted-session.ts';

export type { RouteHop } from './hosted-session.ts';
import { listPeers } from './peers.ts';
import { DEFAULT_SAMPLE_RATE } from './verifier.ts';
import { RemoteStage } from './remote-stage.ts';

/** One page of the validator's index of hosted models (`tensorlink models`). */
export async function listModels(node: Libp2p, validator: DialTarget, page = 0): Promise<{ models: HostedModelEntry[]; next?: number }> {
  return parseModelsAnswer(await request(node, validator, { type: 'models', page }));
}

/** How a hosted model's steps are checked: the share of the steps hosts sign that the validator re-runs. */
export interface HostedVerify {
  /** Default DEFAULT_SAMPLE_RATE (0.05); 0: none. */
  sampleRate?: number;
}

/** What a route is for: the tokens a session will hold, hosts to avoid, and the blocks [from, to) to cover (default: all). */
export interface RouteOptions {
  tokens?: number;
  avoid?: ReadonlySet<string>;
  from?: number;
  to?: number;
}

/** Open sessions on a host that double its blocks' predicted time. */
const SESSIONS_PER_SLOWDOWN = 8;

/** A host short of KV cache for a session of this many tokens costs this much more (in hops) on a route. */
const SHORT_OF_CACHE_PENALTY = 4;

/**
 * The route over a model's online hosts that covers blocks [from, to) (default: every block), in order, with the
 * least predicted cost: each hop costs one (a round trip) plus its blocks over the host's speed, slowed by its open
 * sessions (SESSIONS_PER_SLOWDOWN), and a host with fewer free KV-cache tokens than `tokens` costs
 * SHORT_OF_CACHE_PENALTY more. A shortest path over block boundaries (the
 * boundaries only move forward, so one pass in order is Dijkstra on this DAG); a host's span must lie within the
 * range. Null when no route covers it. `avoid`: hosts not to use (ones that failed).
 */
export function routeOver(
  model: HostedModelEntry, peers: readonly PeerRecord[], options: RouteOptions = {},
): RouteHop[] | null {
  const { tokens = 0, avoid = new Set<string>(), from = 0, to = model.layers } = options;
  const byId = new Map(peers.map((p) => [p.peerId, p]));
  const edges: { from: number; to: number; cost: number; hop: RouteHop }[] = [];
  for (const h of model.hosts) {
    const peer = byId.get(h.peerId);
    if (h.state !== 'online' || !peer || avoid.has(h.peerId) || h.layers[0] < from || h.layers[1] >= to) continue;
    const blocks = h.layers[1] - h.layers[0] + 1;
    const speed = Math.max(1, peer.capabilities?.gflops ?? 1);
    const short = h.freeTokens !== undefined && h.freeTokens < tokens ? SHORT_OF_CACHE_PENALTY : 0;
    const hop = { peerId: h.peerId, addrs: peer.addrs, layers: h.layers };
    // a host's open sessions share its compute: its blocks take longer the more it serves
    const load = 1 + (h.sessions ?? 0) / SESSIONS_PER_SLOWDOWN;
    edges.push({ from: h.layers[0], to: h.layers[1] + 1, cost: 1 + (blocks / speed) * load + short, hop });
  }
  edges.sort((a, b) => a.from - b.from);
  const best = new Map<number, number>([[from, 0]]);
  const via = new Map<number, { at: number; hop: RouteHop }>();
  for (const e of edges) {
    const here = best.get(e.from);
    if (here === undefined) continue;
    if (here + e.cost < (best.get(e.to) ?? Number.POSITIVE_INFINITY)) {
      best.set(e.to, here + e.cost);
      via.set(e.to, { at: e.from, hop: e.hop });
    }
  }
  if (!best.has(to)) return null;
  const route: RouteHop[] = [];
  for (let at = to; at > from; at = via.get(at)!.at) route.unshift(via.get(at)!.hop);
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
    node: Libp2p,
    validatorAddr: string | DialTarget,
    name: string,
    options: { ends: CausalLM | string; hash?: string; verify?: HostedVerify },
  ): Promise<HostedModel> {
    const validator = typeof validatorAddr === 'string' ? multiaddr(validatorAddr) : validatorAddr;
    const entry = await findModel(node, validator, name, options.hash);
    const ends = typeof options.ends === 'string' ? await loadModel(options.ends, { part: 'ends' }) : options.ends;
    if (ends.config.layers !== entry.layers) {
      throw new InvalidArgumentError(`the ends are of a model with ${ends.config.layers} blocks; '${name}' has ${entry.layers}`);
    }
    const model = new HostedModel(node, validator, entry, ends);
    model.sampleRate = options.verify?.sampleRate ?? DEFAULT_SAMPLE_RATE;
    return model;
  }

  /** The share of hosts' signed steps the validator re-runs (HostedVerify). */
  private sampleRate = DEFAULT_SAMPLE_RATE;
  /** Hosts caught cheating: never routed over again by this model. */
  readonly excluded = new Set<string>();
  /** What checking the hosts did: records re-run, failed, and the hosts caught. */
  readonly verification = { checked: 0, failed: 0, unchecked: 0, flagged: [] as string[] };

  /** Generates from `prompt` over a fresh route (see GenerateOptions); the session is closed on every host after. */
  async generate(prompt: number[], options: GenerateOptions = {}): Promise<{ tokens: number[] }> {
    const [tokens] = await this.generateBatch([prompt], options);
    return { tokens };
  }

  /**
   * Generates a batch of prompts in one session. A share of the steps hosts sign (the sample rate) is re-run by the
   * validator before the session closes; a host caught is excluded and the batch generated again without it (once).
   */
  async generateBatch(prompts: number[][], options: GenerateOptions = {}): Promise<number[][]> {
    for (let attempt = 0; ; attempt++) {
      const caught = this.verification.flagged.length;
      const out = await this.generateOnce(prompts, options);
      if (this.verification.flagged.length === caught) return out;
      if (attempt >= 1) throw new VerificationError(`hosts of '${this.entry.name}' were caught cheating twice in a row: ${this.verification.flagged.join(', ')}`);
    }
  }

  private async generateOnce(prompts: number[][], options: GenerateOptions): Promise<number[][]> {
    const tokens = Math.max(...prompts.map((p) => p.length)) + (options.maxNewTokens ?? 32);
    const route = await this.route({ tokens });
    if (!route) throw new PlanInfeasibleError(`no online hosts cover every block of '${this.entry.name}' now (hosts caught cheating are left out)`);
    const audits: Promise<void>[] = [];
    const session = await HostedSession.open(this.router(tokens, audits), route);
    this.onSession?.(session);
    try {
      const out = await generateWith(this.stepModel(session), prompts, options);
      // the sampled steps are re-run while the hosts still keep the session
      await Promise.all(audits);
      return out;
    } finally {
      this.failovers.push(...session.failovers);
      await Promise.all(audits).catch(() => {});
      await session.close();
    }
  }

  /** Asks the validator to re-run one step a host signed; a failed check excludes the host. */
  private async audit(hop: RouteHop, record: unknown, sent: string[]): Promise<void> {
    const { entry } = this;
    const jobId = hostedJobId({ name: entry.name, hash: entry.hash, layers: hop.layers });
    const message = {
      type: 'audit', jobId, worker: { peerId: hop.peerId, addrs: hop.addrs }, config: configToHF(this.ends.config), optimizer: { lr: 0 }, record, sent,
    };
    let answer: Record<string, unknown>;
    try {
      answer = await request(this.node, this.validator, message, TRAIN_REQUEST_TIMEOUT_MS);
    } catch {
      this.verification.unchecked++;
      return;
    }
    if (answer.inconclusive === true || answer.unavailable === true) {
      this.verification.unchecked++;
      return;
    }
    this.verification.checked++;
    if (answer.ok === true) return;
    this.verification.failed++;
    if (!this.excluded.has(hop.peerId)) {
      this.excluded.add(hop.peerId);
      this.verification.flagged.push(hop.peerId);
    }
  }

  /** Called with each session as it opens (its route, its failovers): for progress and tests. */
  onSession?: (session: HostedSession) => void;
  /** Host failures its sessions recovered from. */
  readonly failovers: HostedSession['failovers'] = [];

  /** A route over blocks [from, to) from a fresh look at the index and the peers. */
  private async route(options: RouteOptions): Promise<RouteHop[] | null> {
    const { node, validator } = this;
    const [peers, entry] = await Promise.all([listPeers(node, validator), findModel(node, validator, this.entry.name, this.entry.hash)]);
    return routeOver(entry, peers, { ...options, avoid: new Set([...(options.avoid ?? []), ...this.excluded]) });
  }

  private router(tokens: number, audits: Promise<void>[]): SessionRouter {
    return {
      stageFor: (hop) => this.stageFor(hop),
      reroute: (from, to, avoid) => this.route({ tokens, from, to, avoid }),
      onRecord: (hop, record, sent) => {
        if (this.sampleRate > 0 && Math.random() < this.sampleRate) audits.push(this.audit(hop, record, sent()));
      },
    };
  }

  /** A step of a session: the user's embedding, each host's blocks in turn (each answers its sender), the user's head. */
  private stepModel(session: HostedSession): StepModel {
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
        const x = await session.step(noGrad(() => embed.forward(ids, ctx)), positions, keyMask);
        past += t;
        return noGrad(() => head.forward(norm.forward(x, ctx), ctx));
      },
    };
  }

  private async stageFor(hop: RouteHop): Promise<RemoteStage> {
    const entry = this.entry;
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
