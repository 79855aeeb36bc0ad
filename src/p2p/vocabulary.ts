import { fail, finite, int, list, obj, oneOf, peerIdText, strings } from './schema.ts';

/**
 * The one vocabulary of distributed state: what every role says about peers and jobs.
 * Each type comes with the parser that turns a peer's JSON into it (or an
 * InvalidMessageError): the validator parses announcements with these, the user parses the
 * validator's status with these, the worker parses a job's assignment with these.
 */

export const ROLES = ['validator', 'worker', 'user'] as const;
export type Role = (typeof ROLES)[number];
export type Tier = 'A' | 'B' | 'C';

export interface Capabilities {
  /** Memory the worker offers for model sections, in bytes. */
  memoryBytes: number;
  /** Of that, what its jobs do not hold now (weights, training state, activations, KV caches); absent: all of it. */
  memoryFreeBytes?: number;
  /** Measured matrix-product speed of its engine. */
  gflops: number;
  /** A ≥ 20 TFLOPS, B 5–20, C < 5. */
  tier: Tier;
  cores: number;
  backend: string;
  /**
   * On a worker that computes on a device (backend webgpu): its adapter as the machine reports it (onnxruntime does
   * not say which it chose) and the read bandwidth measured there (GB/s, a reduction over 64 MiB as one graph).
   */
  device?: { adapter: string; bandwidthGBs: number };
}

/** A section a worker holds for a job: its layers, the format its matrices are held in, and its weights' bytes. */
export interface HeldSection {
  layers: [number, number];
  format: 'f32' | 'bf16' | 'int8' | 'int4';
  bytes: number;
}

/** The states of a hosted span: loading, serving, or about to go. */
export const HOST_STATES = ['joining', 'online', 'leaving'] as const;
export type HostState = (typeof HOST_STATES)[number];

/**
 * A span of a named model a worker hosts for anyone to use: the model's name and the hash of its weights manifest
 * (two hosts' copies are the same model only if their bytes are), its number of blocks, the blocks held (indices
 * from 0, inclusive), the format they are held in, its state, and the KV-cache tokens it can still admit.
 */
export interface HostedSpan {
  name: string;
  hash: string;
  blocks: number;
  layers: [number, number];
  format: HeldSection['format'];
  state: HostState;
  freeTokens?: number;
  /** Sessions open on the span now (the users' generations it serves). */
  sessions?: number;
  /** What the host adds to each of its blocks' throughput (its measured speed): placement weighs blocks by it. */
  throughput?: number;
}

/** Round-trip time and bandwidth from one peer to another, as last measured. */
/** How one peer reaches another: a direct TCP connection, a direct WebRTC connection (signalled through a relay), or a relay. */
export const PATH_KINDS = ['direct', 'webrtc', 'relayed'] as const;
export type PathKind = (typeof PATH_KINDS)[number];

export interface Proximity {
  rttMs: number;
  mbps: number;
  measuredAt: number;
  /**
   * The other way, from that peer to this one, as jobs' transfers achieved it (passive
   * measurement: an exponential average of the transfers that peer sent here), and when last updated.
   */
  inbound?: { mbps: number; measuredAt: number };
  /** The path the probe took: a direct TCP connection, a direct WebRTC one (both behind NAT), or through a relay. */
  via?: PathKind;
}

/**
 * A peer's network coordinate (plan/vivaldi.ts): a point in milliseconds, a height (its access link's share of every
 * round trip) and its own error estimate. Round trips to a peer nobody measured are predicted from these.
 */
export interface NetworkCoordinate {
  x: [number, number, number];
  height: number;
  error: number;
}

/** Coordinates past these bounds are refused (a peer cannot make every host look nearest, or another continent's). */
export const COORDINATE_LIMITS = { ms: 100_000, error: 10 } as const;

export function parseCoordinate(v: unknown, what = 'coordinate'): NetworkCoordinate {
  const o = obj(v, what);
  const x = o.x;
  if (!Array.isArray(x) || x.length !== 3) fail(`${what}.x must be three numbers`);
  const ms = COORDINATE_LIMITS.ms;
  return {
    x: [finite(x[0], `${what}.x[0]`, -ms, ms), finite(x[1], `${what}.x[1]`, -ms, ms), finite(x[2], `${what}.x[2]`, -ms, ms)],
    height: finite(o.height, `${what}.height`, 0, ms),
    error: finite(o.error, `${what}.error`, 0, COORDINATE_LIMITS.error),
  };
}

export interface PeerRecord {
  peerId: string;
  roles: Role[];
  capabilities: Capabilities | null;
  /** Every address the peer announced: a dialer is handed all of them and picks what it can reach. */
  addrs: string[];
  /** What this peer measured to the peers it knows (peer id → round trip and bandwidth). */
  proximity: Record<string, Proximity>;
  /** Its network coordinate, where it announced one. */
  coordinate?: NetworkCoordinate;
  /** Milliseconds since the epoch when the validator last heard from it. */
  lastSeen: number;
  /** A worker's score with the validator: an exponential moving average of its checks (1 passed, 0 failed). */
  reputation?: number;
  checks?: { passed: number; failed: number };
  /** Flagged by a failed check: given no new work. */
  excluded?: boolean;
  /** A worker's loaded sections, one per job it serves. */
  sections?: HeldSection[];
  /** The spans of named models it hosts for anyone. */
  hosts?: HostedSpan[];
  /** With a chain: its Ethereum account, and its stake, rewards earned and claimed (token units, decimal). */
  account?: string;
  stake?: string;
  earned?: string;
  claimed?: string;
}

/** An Ethereum address: 0x and 40 hex digits. */
export function parseAccount(v: unknown, what: string): string {
  if (typeof v !== 'string' || !/^0x[0-9a-fA-F]{40}$/.test(v)) fail(`${what} must be an Ethereum address (0x and 40 hex digits)`);
  return v;
}

function amount(v: unknown, what: string): string {
  if (typeof v !== 'string' || !/^[0-9]{1,78}$/.test(v)) fail(`${what} must be a token amount (decimal digits)`);
  return v;
}

/** How to reach a peer: its id and every address it announced. */
export interface PeerTarget {
  peerId: string;
  addrs: string[];
}

/** A contiguous range of a model's layers (global indices, end exclusive). */
export interface StageSpan {
  start: number;
  end: number;
}

/** One section of a job on one worker. */
export interface StageAssignment extends StageSpan, PeerTarget {
  /** Which copy of the section (data-parallel replicas); 0 runs generation. */
  replica: number;
}

/** What a worker has done for its jobs (for the swarm's summary). */
export interface WorkCounters {
  /** Forwards of inference sessions (prefill and decoding steps). */
  forwards: number;
  /** Of those, the decoding steps run in a batch with other sessions' steps (continuous batching across users, decode-batch.ts). */
  batchedRows: number;
  trainForwards: number;
  trainBackwards: number;
  optimizerSteps: number;
  /** Tokens through its training forwards. */
  trainTokens: number;
  /** Bytes of weights sent to it for loads, and bytes it found in its own store or checkpoints instead. */
  weightBytesReceived: number;
  weightBytesReused: number;
}

/** Bytes a job moved, by what they carried (each side counts what it sends: the user and every worker add up to the job's traffic). */
export interface Traffic {
  /** Activations and their gradients on pipeline hops (user ↔ worker and worker ↔ worker). */
  activations: number;
  /** Gradients exchanged among the holders of the same parameters (replicas). */
  gradients: number;
  /** Weights and optimizer state: loads, copies for failover, weights pulled back. */
  weights: number;
  /** Control frames: requests, answers, records. */
  control: number;
  /** What verifiers fetch to re-run sampled records (the weights, inputs and gradients a worker kept): evidence, never compressed. */
  audits: number;
}

export const TRAFFIC_KINDS = ['activations', 'gradients', 'weights', 'control', 'audits'] as const;

export function newTraffic(): Traffic {
  return { activations: 0, gradients: 0, weights: 0, control: 0, audits: 0 };
}

export function parseTraffic(v: unknown): Traffic {
  const o = obj(v, 'traffic');
  const n = (k: keyof Traffic) => finite(o[k], `traffic.${k}`, 0);
  // a worker from before audits were counted apart reports none
  return { activations: n('activations'), gradients: n('gradients'), weights: n('weights'), control: n('control'), audits: o.audits === undefined ? 0 : n('audits') };
}

/** Adds `b` into `a`. */
export function addTraffic(a: Traffic, b: Traffic): Traffic {
  for (const k of TRAFFIC_KINDS) a[k] += b[k];
  return a;
}

/** Limits of the vocabulary, each with its reason. */
export const VOCABULARY_LIMITS = {
  /** A peer listens on a few interfaces and transports; 32 leaves room for IPv6 and relays. */
  addrs: 32,
  /** Characters of one multiaddr: a /dns4/…/tcp/…/p2p/… address is under 200. */
  addrLength: 512,
  /** Peers one proximity table may list: a swarm's worth of neighbours, not an amplifier. */
  proximity: 1024,
  /** Sections of one job: one per worker per replica; far more than any plan makes. */
  stages: 1024,
  /** Layers of a model (blocks + ends): the largest open models have ~130. */
  layers: 100_000,
  /** Sections one worker announces: the jobs it may hold at once (MAX_JOBS_PER_WORKER). */
  sections: 64,
} as const;

export function tierOf(gflops: number): Tier {
  return gflops >= 20_000 ? 'A' : gflops >= 5_000 ? 'B' : 'C';
}

export function parseCapabilities(v: unknown): Capabilities {
  const o = obj(v, 'capabilities');
  const tier = oneOf(o.tier, 'capabilities.tier', ['A', 'B', 'C'] as const);
  const backend = o.backend;
  if (typeof backend !== 'string' || backend.length > 32) fail('capabilities.backend must be a short string');
  return {
    memoryBytes: finite(o.memoryBytes, 'capabilities.memoryBytes'),
    ...(o.memoryFreeBytes === undefined ? {} : { memoryFreeBytes: finite(o.memoryFreeBytes, 'capabilities.memoryFreeBytes', 0) }),
    gflops: finite(o.gflops, 'capabilities.gflops', 0, 1e9),
    tier,
    cores: finite(o.cores, 'capabilities.cores', 1, 4096),
    backend,
    ...(o.device === undefined ? {} : { device: parseDevice(o.device) }),
  };
}

function parseDevice(v: unknown): { adapter: string; bandwidthGBs: number } {
  const o = obj(v, 'capabilities.device');
  if (typeof o.adapter !== 'string' || o.adapter.length > 128) fail('capabilities.device.adapter must be a string of at most 128 characters');
  return { adapter: o.adapter, bandwidthGBs: finite(o.bandwidthGBs, 'capabilities.device.bandwidthGBs', 0, 1e6) };
}

export function parseRoles(v: unknown): Role[] {
  return list(v, 'roles', ROLES.length, (r, what) => oneOf(r, what, ROLES));
}

export function parseAddrs(v: unknown): string[] {
  return strings(v, 'addrs', VOCABULARY_LIMITS.addrs, VOCABULARY_LIMITS.addrLength);
}

export function parseProximity(v: unknown): Record<string, Proximity> {
  if (v === undefined) return {};
  const entries = Object.entries(obj(v, 'proximity'));
  if (entries.length > VOCABULARY_LIMITS.proximity) fail(`proximity lists more than ${VOCABULARY_LIMITS.proximity} peers`);
  const out: Record<string, Proximity> = {};
  for (const [peer, raw] of entries) {
    peerIdText(peer, 'a proximity entry');
    const e = obj(raw, `proximity[${peer}]`);
    out[peer] = {
      rttMs: finite(e.rttMs, 'proximity.rttMs', 0, 1e6),
      mbps: finite(e.mbps, 'proximity.mbps', 0, 1e9),
      measuredAt: finite(e.measuredAt, 'proximity.measuredAt'),
      ...(e.inbound === undefined ? {} : { inbound: parseInbound(e.inbound) }),
      ...(e.via === undefined ? {} : { via: oneOf(e.via, 'proximity.via', PATH_KINDS) }),
    };
  }
  return out;
}

function parseInbound(v: unknown): { mbps: number; measuredAt: number } {
  const o = obj(v, 'proximity.inbound');
  return { mbps: finite(o.mbps, 'proximity.inbound.mbps', 0, 1e9), measuredAt: finite(o.measuredAt, 'proximity.inbound.measuredAt') };
}

/** A peer record as the validator's `status` lists it. */
export function parsePeerRecord(v: unknown, what = 'peer'): PeerRecord {
  const o = obj(v, what);
  return {
    peerId: peerIdText(o.peerId, `${what}.peerId`),
    roles: parseRoles(o.roles),
    capabilities: o.capabilities === null || o.capabilities === undefined ? null : parseCapabilities(o.capabilities),
    addrs: parseAddrs(o.addrs),
    proximity: parseProximity(o.proximity),
    lastSeen: finite(o.lastSeen, `${what}.lastSeen`),
    ...(o.coordinate === undefined ? {} : { coordinate: parseCoordinate(o.coordinate, `${what}.coordinate`) }),
    ...(o.reputation === undefined ? {} : { reputation: finite(o.reputation, `${what}.reputation`, 0, 1) }),
    ...(o.checks === undefined ? {} : { checks: parseChecks(o.checks, `${what}.checks`) }),
    ...(o.excluded === undefined ? {} : { excluded: o.excluded === true }),
    ...(o.account === undefined ? {} : { account: parseAccount(o.account, `${what}.account`) }),
    ...(o.sections === undefined ? {} : { sections: parseHeldSections(o.sections) }),
    ...(o.hosts === undefined ? {} : { hosts: parseHostedSpans(o.hosts) }),
    ...Object.fromEntries((['stake', 'earned', 'claimed'] as const).filter((k) => o[k] !== undefined).map((k) => [k, amount(o[k], `${what}.${k}`)])),
  };
}

/** The sections a worker announces (at most one per job it may hold). */
export function parseHeldSections(v: unknown): HeldSection[] {
  return list(v, 'sections', VOCABULARY_LIMITS.sections, (e, what) => {
    const o = obj(e, what);
    if (!Array.isArray(o.layers) || o.layers.length !== 2) fail(`${what}.layers must be [start, end]`);
    const start = int(o.layers[0], `${what}.layers[0]`, 0, VOCABULARY_LIMITS.layers);
    return {
      layers: [start, int(o.layers[1], `${what}.layers[1]`, start + 1, VOCABULARY_LIMITS.layers)],
      format: oneOf(o.format, `${what}.format`, ['f32', 'bf16', 'int8', 'int4'] as const),
      bytes: finite(o.bytes, `${what}.bytes`, 0),
    };
  });
}

/** A model's name as hosts announce it and users ask for it: letters, digits and . _ - (at most 64). */
export function parseModelName(v: unknown, what = 'model name'): string {
  if (typeof v !== 'string' || !/^[A-Za-z0-9._-]{1,64}$/.test(v)) fail(`${what} must be 1–64 letters, digits, '.', '_' or '-'`);
  return v;
}

/**
 * The id a hosted model's use is paid under: a user's escrow for the model is bound to this id and the user (see
 * escrowJobOf in the ledger, which maps each span's records to it).
 */
export function hostedModelJob(model: Pick<HostedSpan, 'name' | 'hash'>): string {
  return `host_${model.name.replace(/[^A-Za-z0-9_-]/g, '_').slice(0, 32)}_${model.hash.slice(0, 12)}`;
}

/**
 * The id of a job planned again for the `n`th time (a worker caught or lost): a new id, so its records are not the
 * first's, that names the first (a UUID), whose escrow pays them (see escrowJobOf in the ledger). Its random end keeps
 * anyone who knows the first id from opening the next ones on workers first (a worker gives a job id to whoever opens it).
 */
export function replannedJobId(first: string, n: number): string {
  // Web Crypto's (Node's and a tab's): this module runs in both
  const random = [...globalThis.crypto.getRandomValues(new Uint8Array(4))].map((b) => b.toString(16).padStart(2, '0')).join('');
  return `${first.replace(/_r[0-9]+_[0-9a-f]{8}$/, '')}_r${n}_${random}`;
}

/** The job id a host serves a span under, which a session's requests name: the model, its hash's start, the blocks. */
export function hostedJobId(span: Pick<HostedSpan, 'name' | 'hash' | 'layers'>): string {
  return `${hostedModelJob(span)}_${span.layers[0]}-${span.layers[1]}`;
}

/** The spans a worker announces it hosts. */
export function parseHostedSpans(v: unknown): HostedSpan[] {
  return list(v, 'hosts', VOCABULARY_LIMITS.sections, (e, what) => {
    const o = obj(e, what);
    const blocks = int(o.blocks, `${what}.blocks`, 1, VOCABULARY_LIMITS.layers);
    if (!Array.isArray(o.layers) || o.layers.length !== 2) fail(`${what}.layers must be [first, last]`);
    const first = int(o.layers[0], `${what}.layers[0]`, 0, blocks - 1);
    if (typeof o.hash !== 'string' || !/^[0-9a-f]{64}$/.test(o.hash)) fail(`${what}.hash must be a sha256 in hex`);
    return {
      name: parseModelName(o.name, `${what}.name`),
      hash: o.hash,
      blocks,
      layers: [first, int(o.layers[1], `${what}.layers[1]`, first, blocks - 1)],
      format: oneOf(o.format, `${what}.format`, ['f32', 'bf16', 'int8', 'int4'] as const),
      state: oneOf(o.state, `${what}.state`, HOST_STATES),
      ...(o.freeTokens === undefined ? {} : { freeTokens: finite(o.freeTokens, `${what}.freeTokens`, 0) }),
      ...(o.sessions === undefined ? {} : { sessions: int(o.sessions, `${what}.sessions`, 0, 1_000_000) }),
      ...(o.throughput === undefined ? {} : { throughput: finite(o.throughput, `${what}.throughput`, 0, 1e12) }),
    };
  });
}

export function parsePeerTarget(v: unknown, what = 'peer'): PeerTarget {
  const o = obj(v, what);
  return { peerId: peerIdText(o.peerId, `${what}.peerId`), addrs: parseAddrs(o.addrs) };
}

export function parseStageAssignment(v: unknown, what = 'stage'): StageAssignment {
  const o = obj(v, what);
  const start = int(o.start, `${what}.start`, 0, VOCABULARY_LIMITS.layers);
  return {
    ...parsePeerTarget(o, what),
    start,
    end: int(o.end, `${what}.end`, start + 1, VOCABULARY_LIMITS.layers),
    replica: int(o.replica, `${what}.replica`, 0, VOCABULARY_LIMITS.stages),
  };
}

/** A job's whole assignment: every section on every worker. */
export function parseAssignment(v: unknown): StageAssignment[] {
  return list(v, 'assignment', VOCABULARY_LIMITS.stages, parseStageAssignment);
}

export function parseWorkCounters(v: unknown): WorkCounters {
  const o = obj(v, 'work');
  const n = (k: keyof WorkCounters) => finite(o[k], `work.${k}`);
  return {
    forwards: n('forwards'),
    batchedRows: o.batchedRows === undefined ? 0 : n('batchedRows'), // absent from workers before it
    trainForwards: n('trainForwards'),
    trainBackwards: n('trainBackwards'),
    optimizerSteps: n('optimizerSteps'),
    trainTokens: n('trainTokens'),
    weightBytesReceived: n('weightBytesReceived'),
    weightBytesReused: n('weightBytesReused'),
  };
}

export function newWorkCounters(): WorkCounters {
  return {
    forwards: 0, batchedRows: 0, trainForwards: 0, trainBackwards: 0, optimizerSteps: 0, trainTokens: 0, weightBytesReceived: 0,
    weightBytesReused: 0,
  };
}

/** Job ids name jobs on workers and in logs: short, and safe as file and key names. */
export function parseJobId(v: unknown): string {
  if (typeof v !== 'string' || !/^[A-Za-z0-9_-]{1,64}$/.test(v)) fail('jobId must be 1–64 letters, digits, _ or -');
  return v;
}

function parseChecks(v: unknown, what: string): { passed: number; failed: number } {
  const o = obj(v, what);
  return { passed: int(o.passed, `${what}.passed`, 0), failed: int(o.failed, `${what}.failed`, 0) };
}
