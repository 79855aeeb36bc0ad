import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError, PlanInfeasibleError, VerificationError } from '../errors.ts';
import {
  type CausalLM, configToHF, defaultPositions, type ForwardOptions, generateSpeculative, generateWith, type GenerateOptions, loadModel,
  type SpeculativeOptions, type SpeculativeResult, type StepModel,
} from '../models/index.ts';
import {
  type DialTarget, type HostedModelEntry, hostedJobId, request, Slots, TRAIN_REQUEST_TIMEOUT_MS, validatorTarget,
} from '../p2p/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { agree, COMMIT_CHUNK, type ComputeFormat, ortTolerance, sectionCost, type WorkRecord } from '../verify/index.ts';
import { measuredRoute, type RouteOptions } from './hosted-routing.ts';
import { findModel } from './model-index.ts';
import { LedgerSubmitter } from './ledger-submitter.ts';
import { HostedSession, MAX_KEPT_INPUT_BYTES, type RouteHop, type SessionRouter } from './hosted-session.ts';

export type { RouteHop } from './hosted-session.ts';
export { routeOver, type RouteOptions } from './hosted-routing.ts';
import { listPeers } from './peers.ts';
import { DEFAULT_SAMPLE_RATE } from './verifier.ts';
import { ChunkSampler, DEFAULT_CHUNK_RATE } from './hosted-checks.ts';
import { RemoteStage } from './remote-stage.ts';

/** A user's re-runs waiting at a validator at once (its queue refuses a peer past 32: AUDIT_LIMITS). */
export const AUDITS_IN_FLIGHT = 8;

/** How a hosted model's steps are checked. */
export interface HostedVerify {
  /**
   * How the validator checks hosts: 'commit' (default) checks the activation commitments of sampled chunks of 32
   * positions as they close, prefilling each host's blocks over the session once as it goes (no weights move after
   * the span's first check; any backend); 'reexec' re-runs sampled steps one by one with the weights the host hands
   * over (bit for bit on js).
   */
  mode?: 'commit' | 'reexec';
  /**
   * The share the validator checks: of the chunks hosts commit to (default DEFAULT_CHUNK_RATE, 0.37), or with 'reexec'
   * of the steps hosts sign (default DEFAULT_SAMPLE_RATE, 0.05); 0: none.
   */
  sampleRate?: number;
  /**
   * With 'commit': the share of the steps that close no chunk (a session's last positions after its last whole chunk,
   * all of a session shorter than 32) re-run as with 'reexec'. Default DEFAULT_SAMPLE_RATE (0.05), 0 when sampleRate is
   * 0.
   */
  tailRate?: number;
  /**
   * Security level k (DCI's "pay more for more subgraphs"): every step runs on k routes over different hosts and their
   * results are compared before the user takes one (bit for bit on js); when they differ the validator re-runs every
   * host's step and the routes with a host caught are dropped. Default 1.
   */
  redundancy?: number;
}

/**
 * A model the swarm hosts, used by name: the user holds only its ends (embedding, final norm, head) and routes each
 * session over hosts that cover every block. Many users' sessions share the hosts' one loaded copy; each session's
 * KV cache lives on its hosts, bound to this user's peer.
 * @example
 * const m = await HostedModel.open(node, validator, 'tiny', { ends: 'models/tiny' })
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
    node: Libp2p, validatorAddr: string | DialTarget, name: string,
    options: {
      ends: CausalLM | string;
      hash?: string;
      verify?: HostedVerify;
      /**
       * Hand every step the hosts signed, once its session's sampled re-runs passed, to the validator's ledger with this
       * user's acceptance: with a chain, the user's escrow for the model (hostedModelJob) pays them by their FLOPs.
       */
      ledger?: boolean;
      /** Inputs each session keeps to replay on another host (default MAX_KEPT_INPUT_BYTES; see HostedSession). */
      maxKeptBytes?: number;
    },
  ): Promise<HostedModel> {
    const validator = validatorTarget(validatorAddr);
    const entry = await findModel(node, validator, name, options.hash);
    const ends = typeof options.ends === 'string' ? await loadModel(options.ends, { part: 'ends' }) : options.ends;
    if (ends.config.layers !== entry.layers) {
      throw new InvalidArgumentError(`the ends are of a model with ${ends.config.layers} blocks; '${name}' has ${entry.layers}`);
    }
    const model = new HostedModel(node, validator, entry, ends);
    model.mode = options.verify?.mode ?? 'commit';
    model.sampleRate = options.verify?.sampleRate ?? (model.mode === 'commit' ? DEFAULT_CHUNK_RATE : DEFAULT_SAMPLE_RATE);
    model.tailRate = options.verify?.tailRate ?? (model.sampleRate === 0 ? 0 : DEFAULT_SAMPLE_RATE);
    const k = options.verify?.redundancy ?? 1;
    if (!Number.isInteger(k) || k < 1) throw new InvalidArgumentError(`the security level (redundancy) must be an integer ≥ 1, got ${k}`);
    model.redundancy = k;
    if (options.ledger) model.ledger = new LedgerSubmitter(node, validator);
    model.maxKeptBytes = options.maxKeptBytes ?? MAX_KEPT_INPUT_BYTES;
    return model;
  }

  /** How hosts are checked, and the share of their chunks (or steps) checked (HostedVerify). */
  private mode: 'commit' | 'reexec' = 'commit';
  private sampleRate = DEFAULT_CHUNK_RATE;
  private tailRate = DEFAULT_SAMPLE_RATE;
  /** Routes each step runs on (HostedVerify.redundancy). */
  private redundancy = 1;
  /** Where accepted steps go (the `ledger` option); null: they are not recorded. */
  private ledger: LedgerSubmitter | null = null;
  private maxKeptBytes = MAX_KEPT_INPUT_BYTES;
  /** Its re-runs at the validator: AUDITS_IN_FLIGHT at once, the rest wait here (not in the validator's queue, which refuses a burst). */
  private readonly inFlight = new Slots(AUDITS_IN_FLIGHT);
  /** Hosts caught cheating: never routed over again by this model. */
  readonly excluded = new Set<string>();
  /**
   * What checking the hosts did: records re-run, failed, left unchecked (the validator unreachable), steps whose
   * routes were compared (redundancy), the hosts caught.
   */
  readonly verification = {
    checked: 0, failed: 0, unchecked: 0, compared: 0, flagged: [] as string[],
    /** Chunks checked, and the largest difference from their commitments among those that passed. */
    chunks: 0, worst: { expMismatches: 0, mantMean: 0, mantMedian: 0 },
  };

  /** Hosts of the routes the step under way dropped (redundancy): their results were never taken. */
  private readonly dropped = new Set<string>();
  /** Steps handed to the ledger (the `ledger` option) and their FLOPs: what the user's escrow pays for. */
  readonly recorded = { records: 0, flops: 0 };

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
    const tokens = Math.max(...prompts.map((p) => p.length)) + (options.maxNewTokens ?? 32);
    return this.retried(() => this.generateOnce(tokens, (lanes) => generateWith(this.stepModel(lanes), prompts, options)));
  }

  /**
   * The logits [B, T, V] of token ids [B, T] (int32): one step over a fresh route, checked as a generation's steps are
   * (a host caught: excluded and the step run again without it, once). RL's KL term reads the base's log-probabilities
   * here.
   */
  async logits(ids: Tensor): Promise<Tensor> {
    if (ids.dtype !== 'int32' || ids.ndim !== 2) throw new InvalidArgumentError(`logits takes int32 ids [batch, time], got ${ids.dtype} [${ids.shape}]`);
    return this.retried(() => this.generateOnce(ids.shape[1], async (lanes) => this.stepModel(lanes).step(ids, {})));
  }

  /** One prompt by speculative decoding (models/generation/speculative.ts) on one route: hosts keep the accepted positions. */
  async generateSpeculative(prompt: number[], options: SpeculativeOptions): Promise<SpeculativeResult> {
    if (this.redundancy > 1) throw new InvalidArgumentError('speculative decoding does not combine with a security level above 1 yet');
    const tokens = prompt.length + (options.maxNewTokens ?? 32);
    return this.retried(() => this.generateOnce(tokens, (lanes) => generateSpeculative(this.stepModel(lanes, true), prompt, options)));
  }

  /** Runs `once`, and once more when a host of a route whose results were taken was caught. */
  private async retried<T>(once: () => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      const caught = this.verification.flagged.length;
      this.dropped.clear();
      const out = await once();
      // hosts caught on a redundant route that was dropped: none of their results were taken
      if (this.verification.flagged.slice(caught).every((peer) => this.dropped.has(peer))) return out;
      if (attempt >= 1) throw new VerificationError(`hosts of '${this.entry.name}' were caught cheating twice in a row: ${this.verification.flagged.join(', ')}`);
    }
  }

  private async generateOnce<T>(tokens: number, drive: (lanes: Lane[]) => Promise<T>): Promise<T> {
    const routes = await this.routes(tokens);
    const audits: Promise<unknown>[] = [];
    const signed: SignedStep[] = [];
    const lanes: Lane[] = [];
    const opened: Lane[] = [];
    const sampler = new ChunkSampler<RouteHop>(this.mode === 'commit' ? this.sampleRate : 0);
    try {
      for (const route of routes) {
        const lane: Lane = { session: null!, last: [] };
        lane.session = await HostedSession.open(this.router(tokens, audits, signed, lane, lanes, sampler), route, this.maxKeptBytes);
        lanes.push(lane);
        opened.push(lane);
        this.onSession?.(lane.session);
      }
      const out = await drive(lanes);
      for (const lane of lanes) lane.session.settle();
      // the sampled chunks were checked as they closed (each host's session prefilled once, as it went)
      // the steps no closed chunk covers (a session's tail) are re-run at tailRate
      for (const t of sampler.takeTails()) {
        if (this.tailRate > 0 && Math.random() < this.tailRate) audits.push(this.audit(t.hop, t.record, t.sent()));
      }
      // the sampled steps are re-run while the hosts still keep the session
      await Promise.all(audits);
      this.accept(signed);
      return out;
    } finally {
      for (const lane of opened) this.failovers.push(...lane.session.failovers);
      await Promise.all(audits).catch(() => {});
      await Promise.all(opened.map((lane) => lane.session.close()));
    }
  }

  /** `redundancy` routes over different hosts (the first as routeOver gives it; each next one avoids the ones before). */
  private async routes(tokens: number): Promise<RouteHop[][]> {
    const routes: RouteHop[][] = [];
    const used = new Set<string>();
    while (routes.length < this.redundancy) {
      const route = await this.route({ tokens, avoid: used });
      if (!route) {
        if (routes.length === 0) throw new PlanInfeasibleError(`no online hosts cover every block of '${this.entry.name}' now (hosts caught cheating are left out)`);
        throw new PlanInfeasibleError(
          `security level ${this.redundancy} needs ${this.redundancy} routes over different hosts of '${this.entry.name}'; its hosts give ${routes.length} now`,
        );
      }
      routes.push(route);
      for (const hop of route) used.add(hop.peerId);
    }
    return routes;
  }

  /** Hands the steps of a finished session to the ledger: those of hosts not caught, each signed for its span's job. */
  private accept(signed: SignedStep[]): void {
    if (!this.ledger) return;
    const ok = signed.filter((s) =>
      !this.excluded.has(s.hop.peerId) && s.record.job === hostedJobId({ ...this.entry, layers: s.hop.layers }));
    this.ledger.submit(ok.map((s) => s.record));
    this.recorded.records += ok.length;
    this.recorded.flops += ok.reduce((n, s) => n + (s.record.flops ?? 0), 0);
  }

  /**
   * One step on every lane (route). With one lane, its result. With more, their results must agree (bit for bit on js,
   * within the hosts' format's tolerance on what the blocks added on ort); when they do not, the validator re-runs
   * every host's part of this step, the lanes with a host caught are closed, and the first lane all of whose hosts
   * passed goes on.
   */
  private async stepLanes(lanes: Lane[], x: Tensor, positions: Tensor, keyMask: Tensor | null, pass = false): Promise<Tensor> {
    if (lanes.length === 1) return lanes[0].session.step(x, positions, keyMask, pass);
    for (const lane of lanes) lane.last = [];
    const outs = await Promise.all(lanes.map((lane) => lane.session.step(x, positions, keyMask)));
    this.verification.compared++;
    const js = lanes.every((lane) => lane.last.every((s) => s.record.backend === 'js'));
    const format = coarsest(lanes.flatMap((lane) => lane.session.route.map((hop) => this.formatOf(hop))));
    const data = (t: Tensor) => t.data as Float32Array;
    if (outs.every((o) => agree(js ? 'js' : 'ort', data(o), data(outs[0]), format, data(x)))) return outs[0];
    const verdicts = await Promise.all(lanes.map(async (lane) => {
      const checks = await Promise.all(lane.last.map((s) => this.audit(s.hop, s.record, s.sent())));
      return checks.every((ok) => ok === true);
    }));
    const keep = lanes.findIndex((_, i) => verdicts[i]);
    if (keep < 0) throw new VerificationError(`the ${lanes.length} routes of '${this.entry.name}' disagree and none could be reproduced by the validator`);
    const out = outs[keep];
    for (let i = lanes.length - 1; i >= 0; i--) {
      if (verdicts[i]) continue;
      for (const hop of lanes[i].session.route) this.dropped.add(hop.peerId);
      void lanes[i].session.close();
      lanes.splice(i, 1);
    }
    return out;
  }

  /** The format a route's host holds its blocks in, as it announced. */
  private formatOf(hop: RouteHop): ComputeFormat {
    const host = this.entry.hosts.find((h) => h.peerId === hop.peerId && h.layers[0] === hop.layers[0] && h.layers[1] === hop.layers[1]);
    return (host?.format ?? 'f32') as ComputeFormat;
  }

  /** Waits for the steps handed to the ledger to be in a block; the first submission that failed (null: none). */
  async drain(): Promise<Error | null> {
    return this.ledger ? this.ledger.drain() : null;
  }

  /**
   * Asks the validator to re-run one step a host signed, or (`commit`) to check the sampled chunks of the host's
   * session up to `record`; a failed check excludes the host. Null: left unchecked.
   */
  private async audit(
    hop: RouteHop, record: WorkRecord, sent: string[], commit?: { checks: WorkRecord[]; chunks: number[]; keep?: boolean },
  ): Promise<boolean | null> {
    const { entry } = this;
    const jobId = hostedJobId({ name: entry.name, hash: entry.hash, layers: hop.layers });
    const message = {
      type: 'audit', jobId, worker: { peerId: hop.peerId, addrs: hop.addrs }, config: configToHF(this.ends.config), optimizer: { lr: 0 }, record, sent,
      ...(commit ? { commit } : {}),
    };
    let answer: Record<string, unknown>;
    try {
      answer = await this.inFlight.run(() => request(this.node, this.validator, message, TRAIN_REQUEST_TIMEOUT_MS));
    } catch {
      this.verification.unchecked++;
      return null;
    }
    if (answer.inconclusive === true || answer.unavailable === true) {
      this.verification.unchecked++;
      return null;
    }
    this.verification.checked++;
    if (commit) this.verification.chunks += typeof answer.chunks === 'number' ? answer.chunks : 0;
    if (answer.ok === true) {
      const w = answer.worst as Record<string, unknown> | undefined;
      const v = this.verification.worst;
      if (w && typeof w === 'object') {
        for (const k of ['expMismatches', 'mantMean', 'mantMedian'] as const) if (typeof w[k] === 'number') v[k] = Math.max(v[k], w[k]);
      }
      return true;
    }
    this.verification.failed++;
    if (!this.excluded.has(hop.peerId)) {
      this.excluded.add(hop.peerId);
      this.verification.flagged.push(hop.peerId);
    }
    return false;
  }

  /** Called with each session as it opens (its route, its failovers): for progress and tests. */
  onSession?: (session: HostedSession) => void;
  /** Host failures its sessions recovered from. */
  readonly failovers: HostedSession['failovers'] = [];

  /**
   * A route over blocks [from, to) from a fresh look at the index and the peers, by the round trips this node measures
   * or predicts to the model's hosts, its predicted hops confirmed (measuredRoute), and its blocks' FLOPs.
   */
  private async route(options: RouteOptions): Promise<RouteHop[] | null> {
    const { node, validator } = this;
    const [peers, entry] = await Promise.all([listPeers(node, validator), findModel(node, validator, this.entry.name, this.entry.hash)]);
    const avoid = new Set([...(options.avoid ?? []), ...this.excluded]);
    const online = new Set(entry.hosts.filter((h) => h.state === 'online' && !avoid.has(h.peerId)).map((h) => h.peerId));
    this.blockFlops ??= sectionCost(this.ends.config, [1, 2]).flopsPerToken;
    return measuredRoute(node, entry, peers, peers.filter((p) => online.has(p.peerId)), { ...options, avoid, blockFlops: this.blockFlops });
  }

  /** One block's FLOPs per token (every block of the families hosted alike). */
  private blockFlops: number | undefined;

  /**
   * What a lane's session routes by: failed spans go to other hosts (preferring ones no other lane uses); each step a
   * host signed is kept for the ledger and for comparing lanes, and sampled for a re-run.
   */
  private router(
    tokens: number, audits: Promise<unknown>[], signed: SignedStep[], lane: Lane, lanes: Lane[], sampler: ChunkSampler<RouteHop>,
  ): SessionRouter {
    // each host's commitment checks of a session, one after another
    const chains = new Map<string, Promise<unknown>>();
    return {
      stageFor: (hop) => this.stageFor(hop),
      reroute: async (from, to, avoid) => {
        const others = lanes.filter((l) => l !== lane).flatMap((l) => l.session.route.map((hop) => hop.peerId));
        return (others.length > 0 ? await this.route({ tokens, from, to, avoid: new Set([...avoid, ...others]) }) : null)
          ?? this.route({ tokens, from, to, avoid });
      },
      onRecord: (hop, record, sent, input) => {
        if (this.ledger) signed.push({ hop, record });
        if (this.redundancy > 1) lane.last.push({ hop, record, sent });
        // with commitments, the chunks a step closes are sampled and checked at once, while the session goes on: the
        // validator prefills each host's session as it goes (keep), a check at a time per host and session, in order;
        // the steps left uncovered at the end (the tail) are re-run at tailRate
        if (this.mode === 'commit') {
          sampler.offer(hop, record, sent, input);
          for (const c of sampler.take()) {
            const key = `${c.hop.peerId}/${c.last.session}`;
            const commit = { checks: c.checks, chunks: c.chunks, keep: true };
            const check = (chains.get(key) ?? Promise.resolve()).then(() => this.audit(c.hop, c.last, c.sent, commit));
            chains.set(key, check.catch(() => null));
            audits.push(check);
          }
        } else if (this.sampleRate > 0 && Math.random() < this.sampleRate) audits.push(this.audit(hop, record, sent()));
      },
    };
  }

  /** A step of a session: the user's embedding, each host's blocks in turn (each answers its sender), the user's head. */
  private stepModel(lanes: Lane[], passes = false): StepModel {
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
        const x = await this.stepLanes(lanes, noGrad(() => embed.forward(ids, ctx)), positions, keyMask, passes);
        past += t;
        return noGrad(() => head.forward(norm.forward(x, ctx), ctx));
      },
      // speculative passes are cut to their accepted positions; one never crosses a chunk of commitments
      ...(passes && {
        truncate: (n: number) => lanes[0].session.keep(n).then(() => void (past = n)),
        passLimit: (p: number) => COMMIT_CHUNK - (p % COMMIT_CHUNK),
      }),
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

  /** Closes its streams to the hosts, once the steps handed to the ledger are in (see drain). */
  async close(): Promise<void> {
    await this.drain();
    await Promise.all([...this.stages.values()].map((s) => s.close()));
    this.stages.clear();
  }
}

/** A step a host signed, kept until its session's checks are done. */
interface SignedStep {
  hop: RouteHop;
  record: WorkRecord;
}

/** One of a session's redundant routes: its session, and what its hosts signed for the step under way. */
interface Lane {
  session: HostedSession;
  last: (SignedStep & { sent: () => string[] })[];
}

/** The format whose results may drift the most (the tolerance redundant routes are compared with). */
function coarsest(formats: ComputeFormat[]): ComputeFormat {
  return formats.reduce((a, b) => (ortTolerance(b) > ortTolerance(a) ? b : a), 'f32' as ComputeFormat);
}
