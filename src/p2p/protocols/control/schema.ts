import { InvalidMessageError } from '../../../errors.ts';
import { finite, int, list, obj, peerIdText, str } from '../../schema.ts';
import { parseAdapter, type WireAdapter } from '../stage/schema.ts';
import {
  type Capabilities,
  type HeldSection,
  type HostedSpan,
  type NetworkCoordinate,
  parseCoordinate,
  parseHeldSections,
  parseHostedSpans,
  type PeerRecord,
  type PeerTarget,
  parsePeerTarget,
  type Proximity,
  type Role,
  type WorkCounters,
  parseAccount,
  parseAddrs,
  parseCapabilities,
  parseJobId,
  parsePeerRecord,
  parseProximity,
  parseRoles,
  parseWorkCounters,
  VOCABULARY_LIMITS,
} from '../../vocabulary.ts';

/**
 * Messages of the control protocol, one parser per message type. Requests are parsed by the
 * serving side, answers by the asking side; both come from a peer and are untrusted.
 *
 *   announce      {roles, capabilities?, addrs, proximity?}          → ack {ttlMs}          (validator)
 *   status        {page?}                                            → status {peers, uptimeMs, total, next?}
 *   capabilities  {}                                                 → capabilities {capabilities}   (worker)
 *   stats         {}                                                 → stats {work, bytesSent, bytesReceived, jobs, sessions, memory}
 *   proximity     {}                                                 → proximity {proximity}
 *   open-job, job-status, close-job {jobId}                          → job-opened | job-status | job-closed
 */

/** The envelope every control request has: a request id and a message type. */
export function parseEnvelope(message: unknown): { id: number; type: string; body: Record<string, unknown> } {
  const body = obj(message, 'message');
  const id = int(body.id, 'message.id');
  return { id, type: str(body.type, 'message.type', 64), body };
}

export interface Announcement {
  roles: Role[];
  capabilities: Capabilities | null;
  addrs: string[];
  proximity: Record<string, Proximity>;
  /** The peer's Ethereum account (with a chain): where its rewards go, whose stake lets it work. */
  account?: string;
  /** A worker's loaded sections, one per job. */
  sections?: HeldSection[];
  /** The spans of named models it hosts for anyone. */
  hosts?: HostedSpan[];
  /**
   * A worker behind NAT (one holding a slot on the validator's relay): the peers it works with now (its jobs' owners and
   * assignments, its hosted sessions' users), so the relay carries their traffic as a job's. Only sent to the validator.
   */
  peers?: string[];
  /** When it was made (ms since the epoch): a gossiped record older than a few seconds, or than the last one, is a replay. */
  at?: number;
  /** Its network coordinate (plan/vivaldi.ts), from the round trips of its probes. */
  coordinate?: NetworkCoordinate;
}

/** Peers a worker names as the ones it works with (the most recent first; more are left out). */
export const MAX_ANNOUNCED_PEERS = 1024;

export function parseAnnounce(v: unknown): Announcement {
  const m = obj(v, 'announcement');
  return {
    roles: parseRoles(m.roles),
    capabilities: m.capabilities === undefined ? null : parseCapabilities(m.capabilities),
    addrs: parseAddrs(m.addrs ?? []),
    proximity: parseProximity(m.proximity),
    ...(m.account === undefined ? {} : { account: parseAccount(m.account, 'announcement.account') }),
    ...(m.sections === undefined ? {} : { sections: parseHeldSections(m.sections) }),
    ...(m.hosts === undefined ? {} : { hosts: parseHostedSpans(m.hosts) }),
    ...(m.at === undefined ? {} : { at: finite(m.at, 'announcement.at', 0) }),
    ...(m.coordinate === undefined ? {} : { coordinate: parseCoordinate(m.coordinate, 'announcement.coordinate') }),
    ...(m.peers === undefined ? {} : { peers: list(m.peers, 'announcement.peers', MAX_ANNOUNCED_PEERS, (p, what) => peerIdText(p, what)) }),
  };
}

/** One page of the validator's registry (`next`: the cursor of the following page, when there is one). */
export function parseStatusAnswer(m: Record<string, unknown>): { peers: PeerRecord[]; uptimeMs: number; total?: number; next?: number } {
  if (m.type !== 'status') throw new InvalidMessageError(`expected a status answer, got '${String(m.type)}'`);
  if (!Array.isArray(m.peers) || m.peers.length > VOCABULARY_LIMITS.stages * 16) throw new InvalidMessageError('status.peers must be a list of peer records');
  return {
    peers: m.peers.map((p, i) => parsePeerRecord(p, `status.peers[${i}]`)),
    uptimeMs: finite(m.uptimeMs ?? 0, 'status.uptimeMs'),
    ...(m.total === undefined ? {} : { total: int(m.total, 'status.total', 0) }),
    ...(m.next === undefined ? {} : { next: int(m.next, 'status.next', 1) }),
  };
}

export function parseJobRequest(m: Record<string, unknown>): { jobId: string } {
  return { jobId: parseJobId(m.jobId) };
}

export interface Stats {
  work: WorkCounters;
  bytesSent: number;
  bytesReceived: number;
  /** Jobs the worker holds (opened, loading or loaded). */
  jobs: number;
  /** Inference sessions open across its jobs. */
  sessions: number;
  /** Bytes it offers, what its jobs hold, and what is free. */
  memory: { total: number; used: number; free: number };
}

export function parseStatsAnswer(m: Record<string, unknown>): Stats {
  if (m.type !== 'stats') throw new InvalidMessageError(`expected a stats answer, got '${String(m.type)}'`);
  return {
    work: parseWorkCounters(m.work),
    bytesSent: finite(m.bytesSent, 'stats.bytesSent'),
    bytesReceived: finite(m.bytesReceived, 'stats.bytesReceived'),
    jobs: int(m.jobs, 'stats.jobs'),
    sessions: int(m.sessions, 'stats.sessions'),
    memory: parseMemory(m.memory),
  };
}

function parseMemory(v: unknown): Stats['memory'] {
  const o = obj(v, 'stats.memory');
  return { total: finite(o.total, 'stats.memory.total', 0), used: finite(o.used, 'stats.memory.used', 0), free: finite(o.free, 'stats.memory.free', 0) };
}

export function parseCapabilitiesAnswer(m: Record<string, unknown>): Capabilities {
  return parseCapabilities(m.capabilities);
}

/** A user's request that a validator re-run one record of its job (the record itself is parsed by verify/). */
export interface AuditMessage {
  jobId: string;
  worker: PeerTarget;
  config: Record<string, unknown>;
  optimizer: { lr: number; weightDecay?: number };
  record: unknown;
  sent?: string[];
  /** The job's LoRA adapter, as its load named it (the worker's records name the config with it). */
  adapter?: WireAdapter;
  /** For a job over a hosted model: that model (its name, hash and the format the job holds it in), its frozen base. */
  base?: { name: string; hash: string; format: string };
  /** For a job that does not train, given an adapter's factors: their hash on the record's section (verify's factorsHash). */
  factors?: string;
  /**
   * A commitment check of a session's sampled chunks: the records carrying them (parsed by verify/) and the chunks;
   * `keep`: the session is checked as it goes, and the validator keeps its prefill for the next check.
   */
  commit?: { checks: unknown[]; chunks: number[]; keep?: boolean };
}

/** Records one commitment check may carry, and chunks it may ask for. */
export const MAX_COMMIT_CHECKS = 256;
export const MAX_COMMIT_CHUNKS = 4096;

function parseCommit(v: unknown): { checks: unknown[]; chunks: number[]; keep?: boolean } {
  const m = obj(v, 'commit');
  const checks = list(m.checks, 'commit.checks', MAX_COMMIT_CHECKS, (c) => c);
  const chunks = list(m.chunks, 'commit.chunks', MAX_COMMIT_CHUNKS, (c, what) => int(c, what, 0, 1_000_000));
  if (checks.length === 0 || chunks.length === 0) throw new InvalidMessageError('commit: at least one record and one chunk to check');
  return { checks, chunks, ...(m.keep === true ? { keep: true } : {}) };
}

export function parseAuditMessage(m: Record<string, unknown>): AuditMessage {
  const optimizer = obj(m.optimizer, 'optimizer');
  return {
    jobId: parseJobId(m.jobId),
    worker: parsePeerTarget(m.worker, 'worker'),
    config: obj(m.config, 'config'),
    optimizer: {
      lr: finite(optimizer.lr, 'optimizer.lr'),
      ...(optimizer.weightDecay === undefined ? {} : { weightDecay: finite(optimizer.weightDecay, 'optimizer.weightDecay') }),
    },
    record: m.record,
    ...(m.sent === undefined ? {} : { sent: list(m.sent, 'sent', 15_000, (v, what) => str(v, what, 64)) }),
    ...(m.adapter === undefined ? {} : { adapter: parseAdapter(m.adapter) }),
    ...(m.base === undefined ? {} : { base: parseBase(m.base) }),
    ...(m.factors === undefined ? {} : { factors: parseSha(m.factors, 'factors') }),
    ...(m.commit === undefined ? {} : { commit: parseCommit(m.commit) }),
  };
}

function parseSha(v: unknown, what: string): string {
  const hash = str(v, what, 64);
  if (!/^[0-9a-f]{64}$/.test(hash)) throw new InvalidMessageError(`${what} must be a sha256 in hex`);
  return hash;
}

/** The hosted model a job's base is, as an audit names it. */
function parseBase(v: unknown): { name: string; hash: string; format: string } {
  const o = obj(v, 'base');
  const hash = str(o.hash, 'base.hash', 64);
  if (!/^[0-9a-f]{64}$/.test(hash)) throw new InvalidMessageError('base.hash must be a sha256 in hex');
  const format = str(o.format, 'base.format', 8);
  if (!['f32', 'bf16', 'int8', 'int4'].includes(format)) throw new InvalidMessageError(`base.format must be f32, bf16, int8 or int4, got '${format}'`);
  return { name: str(o.name, 'base.name', 64), hash, format };
}

/** One host of a model as the validator's model index lists it. */
export interface ModelHost {
  peerId: string;
  layers: [number, number];
  format: HostedSpan['format'];
  state: HostedSpan['state'];
  freeTokens?: number;
  sessions?: number;
  throughput?: number;
}

/** A hosted model in the index: its name and manifest hash, its blocks, whether every block has an online host, its hosts. */
export interface HostedModelEntry {
  name: string;
  hash: string;
  layers: number;
  complete: boolean;
  hosts: ModelHost[];
}

/**
 * Hosts one entry of the model index lists at most: a model hosted by more is listed as several entries of the same
 * name and hash, each with a share of its hosts (and the whole model's `complete`), so that no page's entry grows with
 * the swarm. A reader of every page merges them (mergeModelEntries).
 */
export const MODEL_HOSTS_PER_ENTRY = 200;

/** Entries of one model (the same name and hash) merged into one, in the order they first came. */
export function mergeModelEntries(entries: readonly HostedModelEntry[]): HostedModelEntry[] {
  const byKey = new Map<string, HostedModelEntry>();
  for (const e of entries) {
    const key = `${e.name}\u0000${e.hash}`;
    const seen = byKey.get(key);
    if (seen) seen.hosts.push(...e.hosts);
    else byKey.set(key, { ...e, hosts: [...e.hosts] });
  }
  return [...byKey.values()];
}

/** The validator's answer to `models`: one page of the index, and the next page's number when there is one. */
export function parseModelsAnswer(m: Record<string, unknown>): { models: HostedModelEntry[]; next?: number } {
  if (m.type !== 'models') throw new InvalidMessageError(`expected a models answer, got '${String(m.type)}'`);
  const models = list(m.models, 'models', 1000, (v, what) => {
    const o = obj(v, what);
    const layers = int(o.layers, `${what}.layers`, 1, 100_000);
    // the hosts are announced spans of this model: the same parser, with the model's own fields
    const hosts = list(o.hosts, `${what}.hosts`, 100_000, (h, where) => {
      const e = obj(h, where);
      const [span] = parseHostedSpans([{ ...e, name: o.name, hash: o.hash, blocks: layers }]);
      return { peerId: peerIdText(e.peerId, `${where}.peerId`), layers: span.layers, format: span.format, state: span.state,
        ...(span.sessions === undefined ? {} : { sessions: span.sessions }),
        ...(span.freeTokens === undefined ? {} : { freeTokens: span.freeTokens }),
        ...(span.throughput === undefined ? {} : { throughput: span.throughput }) };
    });
    return { name: String(o.name), hash: String(o.hash), layers, complete: o.complete === true, hosts };
  });
  return { models, ...(m.next === undefined ? {} : { next: int(m.next, 'models.next', 1) }) };
}
