import type { Libp2p, PeerId } from '@libp2p/interface';
import {
  createLogger, createNode, int, type Logger, pageOf, type Overview, OVERVIEW_LIMITS, parseAnnounce,
  parseAuditMessage, parseJobProgress, type Handler, type PeerRecord, serveControl, serveStun, type StunServer,
  type TensorLinkNode, type HostedModelEntry, mergeModelEntries,
} from '../p2p/index.ts';
import { type RelayLimits, ValidatorRelayGate } from './relay-gate.ts';
import { modelIndex } from './hosted-models.ts';
import { hostedName } from './base-check.ts';
import { EventLog, JobBoard } from './overview.ts';
import { parseRecord, Reputation, type Standing } from '../verify/index.ts';
import { audit, auditKey, type AuditVerdict } from './audit.ts';
import { CheckQueue } from './check-queue.ts';
import { disputeHandler } from './dispute.ts';
import { SectionCache, SessionPrefills } from './sections.ts';
import { PEER_TTL_MS, Registry } from './registry.ts';
import { checkGossip, type GossipStats } from './gossip-check.ts';
import { LedgerService } from './ledger-service.ts';
import { Settler } from './settlement.ts';
import { FLAG_SYNC_MS, SharedView } from './shared-view.ts';
import type { NodeChain } from '../chain/index.ts';

/** Re-executions a validator runs at once; more wait their turn, up to `waiting` in all and `perPeer` for one peer. */
export const MAX_CONCURRENT_AUDITS = 2;
export const AUDIT_LIMITS = { running: MAX_CONCURRENT_AUDITS, waiting: 256, perPeer: 32 };

export interface Validator {
  node: TensorLinkNode;
  /** The live peers, the validator first, each worker with its reputation. */
  peers(): PeerRecord[];
  /** What the peers announced (their records as they sent them). */
  registry: Registry;
  /** Its checks of workers' records so far. */
  reputation: Reputation;
  /** Its Merkle ledger of accepted records. */
  ledger: LedgerService;
  /** Its settlement on the chain (null without one). */
  settler: Settler | null;
  /** Its relay: whom it carries, and what it refused and cut. */
  relay: ValidatorRelayGate;
  /** What it shares with the other validators of its set: their records in `status`, flags, the catch-up of one that joins. */
  shared: SharedView;
  /** Gossiped announcements it accepted, rejected (malformed, past their publisher's rate) and ignored (stale, replays). */
  gossip: GossipStats;
  /** What the dashboard shows: peers, jobs as their users report them, events, the ledger. */
  overview(): Overview;
  stop(): Promise<void>;
}

/** How long the list a paged answer was cut from serves the pages after its first. */
export const PAGED_SNAPSHOT_MS = 10_000;

export interface ValidatorOptions {
  dataDir?: string;
  /** The registry's clock (default Date.now): a test of its scale holds it still, so no record expires while it reads. */
  registryClock?: () => number;
  listen?: string[];
  /** Listen for browser tabs too: WebRTC-direct and WebSockets beside TCP (the CLI's validator does). */
  browsers?: boolean;
  /** Addresses it announces besides its interfaces' (`--announce`: its router's public address and forwarded port). */
  announce?: string[];
  log?: Logger;
  /** Other validators' addresses: blocks are co-signed with them, and a validator behind catches up from them. */
  peers?: string[];
  /** Peer ids of further validators that may join this one's set by saying hello (see LedgerOptions.validators). */
  validators?: string[];
  /** Validator signatures a block needs (default 1). */
  threshold?: number;
  /** The chain it settles on (absent: no chain; the ledger works without one). */
  chain?: NodeChain;
  /** What its relay carries per pair of peers (default RELAY_LIMITS). */
  relayLimits?: Partial<RelayLimits>;
}

/**
 * The validator: bootstrap peer and DHT server, keeper of the registry of workers (fed
 * by their announcements), answering `status` with the swarm's state.
 */
export async function startValidator(options: ValidatorOptions = {}): Promise<Validator> {
  // the validator is its swarm's relay: workers behind NAT reserve a slot on it, the peers it knows reach them through it
  const gate = new ValidatorRelayGate(
    (peer) => registry.knows(peer), (a, b) => registry.worksWith(a, b), options.relayLimits, Date.now, (peer) => registry.offers(peer),
  );
  const node = await createNode({ ...options, relay: gate, browsers: options.browsers ? { websockets: true } : undefined });
  const log = options.log ?? createLogger({ level: 'silent' });
  const events = new EventLog();
  const jobs = new JobBoard();
  const registry = new Registry(log, (kind, peer, roles) => events.add(kind, peer, roles.join(', ')), options.registryClock);
  const reputation = new Reputation();
  // a verdict that ran stands for replays; one whose worker could not be reached is asked again next time
  const audits = new CheckQueue<AuditVerdict>(AUDIT_LIMITS, (v) => !v.unavailable && !v.inconclusive, 'audits');
  // the sections commitment checks run on, fetched once per job and weights
  const sections = new SectionCache();
  // the hosted sessions it checks as they go, each one's prefill so far
  const sessions = new SessionPrefills();
  const withStanding = (p: PeerRecord): PeerRecord => {
    if (!p.roles.includes('worker')) return p;
    const s: Standing = reputation.standing(p.peerId);
    const money = p.account && settler ? settler.standing(p.account) : null;
    return { ...p, reputation: s.score, checks: { passed: s.passed, failed: s.failed }, excluded: s.excluded, ...(money ?? (settler ? { stake: '0' } : {})) };
  };
  const started = Date.now();
  const peers = (): PeerRecord[] => {
    const self: PeerRecord = {
      peerId: node.peerId.toString(),
      roles: ['validator'],
      capabilities: null,
      addrs: node.getMultiaddrs().map(String),
      proximity: {},
      lastSeen: Date.now(),
    };
    return [self, ...shared.records(), ...registry.live().map(withStanding)];
  };
  /**
   * The peers a paged answer (status, models) is cut from: made anew for a first page, and kept for the pages after it
   * for PAGED_SNAPSHOT_MS, so that reading 10,000 peers does not rebuild the list 101 times, and a reader's pages come
   * from one list (no peer twice or missed as the registry changes) unless another reader's first page came between.
   */
  let paged: { at: number; list: PeerRecord[] } | null = null;
  const snapshot = (page: number): PeerRecord[] => {
    if (page === 0 || paged === null || Date.now() - paged.at > PAGED_SNAPSHOT_MS) paged = { at: Date.now(), list: peers() };
    return paged.list;
  };
  // gossip: signed messages, so `from` is the publisher; only checked ones reach the registry (gossip-check.ts)
  const validators = new Set(options.validators ?? []);
  const gossip = checkGossip(node, registry, log, (peer) => validators.has(peer) || ledger.trusts(peer));
  const ledger = new LedgerService(node, reputation, {
    dataDir: options.dataDir, peers: options.peers, validators: options.validators, threshold: options.threshold,
    account: options.chain?.address, log,
  });
  // the registry, the flags and the view it shares with the validators of its set (shared-view.ts)
  const shared = new SharedView(node, ledger, registry, reputation, log, (f) => {
    events.add('check-failed', f.peer, `flagged by validator ${f.by}: ${f.reason}`);
  });
  const settler = options.chain
    ? new Settler(node, ledger, reputation, (peer) => registry.accountOf(peer), options.chain, options.dataDir, log)
    : null;
  await serveControl(node, heardBy(gate, {
    ...ledger.handlers(),
    ...shared.handlers(),
    ...(settler?.handlers() ?? {}),
    'announce': async (m, from: PeerId) => {
      const a = parseAnnounce(m);
      registry.record(from.toString(), a);
      // a worker's first announcement with an account: its stake is read before the answer, so a planner sees it at once
      if (a.account && settler && !settler.knows(a.account)) await settler.refresh(a.account);
      return { type: 'ack', ttlMs: PEER_TTL_MS };
    },
    // the registry a page at a time (`page`: the `next` of the previous answer; 0 first), from one snapshot
    'status': (m) => {
      const page = int(m.page ?? 0, 'status.page', 0, 10_000_000);
      const list = snapshot(page);
      const { items, next } = pageOf(list, page);
      return { type: 'status', peers: items, uptimeMs: Date.now() - started, total: list.length, ...(next === undefined ? {} : { next }) };
    },
    // the models workers host, with their coverage and hosts, a page at a time
    'models': (m) => {
      const page = int(m.page ?? 0, 'models.page', 0, 10_000_000);
      return { type: 'models', ...modelIndex(snapshot(page), page) };
    },
    // a user's report of its job, for the dashboard: shown under the sender's peer id, never used to pay
    'job-progress': (m, from: PeerId) => {
      jobs.report(from.toString(), parseJobProgress(m));
      return { type: 'ack' };
    },
    'overview': () => ({ type: 'overview', ...overview() }),
    // re-runs a record a user sampled (or two redundant workers disagree on) and scores its worker
    'audit': async (m, from: PeerId) => {
      const { commit, ...request } = parseAuditMessage(m);
      const record = parseRecord(request.record);
      const worker = request.worker;
      if (request.base) {
        // the model's name as the worker announced its span (it answers for the model by that name), not the user's
        const name = hostedName(peers(), worker.peerId, request.base.hash);
        if (name === null) {
          const reason = `${worker.peerId} announces no span of model ${request.base.hash.slice(0, 12)}…: its base cannot be checked`;
          return { type: 'audit-result', ok: false, inconclusive: true, reason, peer: worker.peerId };
        }
        request.base = { ...request.base, name };
      }
      const checks = commit ? { commit: { ...commit, checks: commit.checks.map(parseRecord) } } : {};
      // re-executions take CPU and memory: a few at a time, a bounded queue; a replayed request is answered from its first run
      const full = { ...request, record, ...checks };
      const run = () => audit(node, reputation, full, sections, sessions);
      const { value: verdict, replayed } = await audits.run(from.toString(), auditKey(full), run);
      if (replayed) return { type: 'audit-result', ...verdict };
      const what = commit
        ? `chunk(s) ${commit.chunks.join(', ')} of session ${record.session?.slice(0, 8)}, job ${record.job.slice(0, 12)}`
        : `${record.kind === 'step' ? 'update' : record.kind} of step ${record.step}${record.kind === 'step' ? '' : `, micro-batch ${record.micro}`}, job ${record.job.slice(0, 8)}`;
      // a worker that computed with factors other than its user says it gave: the user's word, no evidence (unproven)
      const evidence = !verdict.ok && !verdict.unavailable && !verdict.inconclusive && !verdict.unproven;
      if (verdict.ok) events.add('check-passed', worker.peerId, what);
      else if (evidence) events.add('check-failed', worker.peerId, `${what}: ${verdict.reason}`);
      if (!verdict.ok) log.warn('worker-flagged', { peer: worker.peerId, record: `${record.kind} ${record.step}:${record.micro}`, reason: verdict.reason });
      // a re-execution that ran and failed is evidence: the worker's stake is cut (in the background: the user's answer does not wait)
      if (evidence && settler) {
        settler.slash(record).then(() => events.add('slashed', worker.peerId, `stake cut for ${what}`)).catch((err: unknown) => log.warn('slash-failed', { peer: worker.peerId, error: (err as Error).message }));
      }
      return { type: 'audit-result', ...verdict };
    },
    // two workers' records of the same forward disagree: settled by bisection to one op, re-run alone (dispute.ts)
    'dispute': disputeHandler(node, reputation, log, events, settler),
  }));
  const overview = (): Overview => {
    const show = ledger.summary();
    return {
      validator: node.peerId.toString(), uptimeMs: Date.now() - started, peers: peers(), jobs: jobs.list(), events: events.list(),
      ledger: { ...show, blocks: show.blocks.slice(-OVERVIEW_LIMITS.blocks) },
      // the hosted models: the index's first models, each with its first hosts (its coverage is over all of them)
      models: mergeModelEntries(overviewModels(peers())).slice(0, OVERVIEW_LIMITS.models)
        .map((m) => ({ ...m, hosts: m.hosts.slice(0, OVERVIEW_LIMITS.hostsPerModel) })),
    };
  };
  await ledger.start();
  await shared.catchUp();
  // flags whose push did not reach this validator (it was unreachable a while) come with the next resync
  const resync = setInterval(() => void shared.resync(), FLAG_SYNC_MS);
  resync.unref();
  const stun = await answerStun(node, options.listen ?? [], log);
  settler?.start(() => registry.live().flatMap((p) => (p.account ? [p.account] : [])));
  return {
    node,
    peers,
    registry,
    reputation,
    ledger,
    settler,
    relay: gate,
    shared,
    gossip,
    overview,
    stop: async () => {
      clearInterval(resync);
      ledger.stop();
      settler?.stop();
      await stun?.close();
      await node.stop();
    },
  };
}

/**
 * The validator answers STUN on the UDP port of its TCP port's number (workers behind NAT find it from their bootstrap
 * address: `stunServerOf`), on the interface it listens on. A port taken by something else: no STUN (WebRTC then offers
 * only each side's own addresses), said in the log.
 */
async function answerStun(node: Libp2p, listen: string[], log: Logger): Promise<StunServer | null> {
  const own = node.getMultiaddrs().map((a) => /^\/ip4\/([\d.]+)\/tcp\/(\d+)\/p2p\//.exec(a.toString())).find((m) => m !== null);
  if (!own) return null;
  const host = listen.some((l) => l.startsWith('/ip4/0.0.0.0/')) ? '0.0.0.0' : own[1];
  try {
    return await serveStun(Number(own[2]), host);
  } catch (err) {
    log.warn('stun-unavailable', { port: Number(own[2]), error: (err as Error).message });
    return null;
  }
}

/** The control handlers, each first telling the relay's gate that its sender asked the validator something. */
function heardBy(gate: ValidatorRelayGate, handlers: Record<string, Handler>): Record<string, Handler> {
  return Object.fromEntries(Object.entries(handlers).map(([type, handle]) => [type, (m: Record<string, unknown>, from: PeerId) => {
    gate.heard(from.toString());
    return handle(m, from);
  }]));
}

/** Every page of the model index over `peers` (the overview shows each model once, its entries merged). */
function overviewModels(peers: readonly PeerRecord[]): HostedModelEntry[] {
  const entries: HostedModelEntry[] = [];
  for (let page: number | undefined = 0; page !== undefined;) {
    const answer = modelIndex(peers, page);
    entries.push(...answer.models);
    page = answer.next;
  }
  return entries;
}
