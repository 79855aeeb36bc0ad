import { InvalidMessageError } from '../errors.ts';

/** The shared vocabulary of distributed state: what every role says about peers. */

export type Role = 'validator' | 'worker' | 'user';
export type Tier = 'A' | 'B' | 'C';

export interface Capabilities {
  /** Memory the worker offers for model sections, in bytes. */
  memoryBytes: number;
  /** Measured matrix-product speed of its engine. */
  gflops: number;
  /** A ≥ 20 TFLOPS, B 5–20, C < 5. */
  tier: Tier;
  cores: number;
  backend: string;
}

export interface ProximityEntry {
  rttMs: number;
  mbps: number;
  measuredAt: number;
}

export interface PeerRecord {
  peerId: string;
  roles: Role[];
  capabilities: Capabilities | null;
  addrs: string[];
  /** What this peer measured to the peers it knows (peer id → round trip and bandwidth). */
  proximity: Record<string, ProximityEntry>;
  /** Milliseconds since the epoch when the validator last heard from it. */
  lastSeen: number;
}

export function tierOf(gflops: number): Tier {
  return gflops >= 20_000 ? 'A' : gflops >= 5_000 ? 'B' : 'C';
}

function fail(what: string): never {
  throw new InvalidMessageError(what);
}

function obj(v: unknown, what: string): Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) fail(`${what} must be an object`);
  return v as Record<string, unknown>;
}

function finite(v: unknown, what: string, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) fail(`${what} must be a number in [${min}, ${max}]`);
  return v;
}

function strings(v: unknown, what: string, maxItems: number, maxLength = 512): string[] {
  if (!Array.isArray(v) || v.length > maxItems || !v.every((s) => typeof s === 'string' && s.length <= maxLength)) {
    fail(`${what} must be at most ${maxItems} strings`);
  }
  return v as string[];
}

/** Validates capabilities sent by a peer. */
export function parseCapabilities(v: unknown): Capabilities {
  const o = obj(v, 'capabilities');
  const tier = o.tier;
  if (tier !== 'A' && tier !== 'B' && tier !== 'C') fail('capabilities.tier must be A, B or C');
  const backend = o.backend;
  if (typeof backend !== 'string' || backend.length > 32) fail('capabilities.backend must be a short string');
  return {
    memoryBytes: finite(o.memoryBytes, 'capabilities.memoryBytes'),
    gflops: finite(o.gflops, 'capabilities.gflops', 0, 1e9),
    tier,
    cores: finite(o.cores, 'capabilities.cores', 1, 4096),
    backend,
  };
}

export function parseRoles(v: unknown): Role[] {
  const roles = strings(v, 'roles', 3);
  for (const r of roles) if (r !== 'validator' && r !== 'worker' && r !== 'user') fail(`unknown role '${r}'`);
  return roles as Role[];
}

export function parseAddrs(v: unknown): string[] {
  return strings(v, 'addrs', 32);
}

/** Validates a peer's proximity table (at most 1024 entries). */
export function parseProximity(v: unknown): Record<string, ProximityEntry> {
  if (v === undefined) return {};
  const o = obj(v, 'proximity');
  const entries = Object.entries(o);
  if (entries.length > 1024) fail('proximity lists more than 1024 peers');
  const out: Record<string, ProximityEntry> = {};
  for (const [peer, raw] of entries) {
    if (peer.length > 128) fail('proximity peer id too long');
    const e = obj(raw, `proximity[${peer}]`);
    out[peer] = {
      rttMs: finite(e.rttMs, 'proximity.rttMs', 0, 1e6),
      mbps: finite(e.mbps, 'proximity.mbps', 0, 1e9),
      measuredAt: finite(e.measuredAt, 'proximity.measuredAt'),
    };
  }
  return out;
}

export { finite, obj };
