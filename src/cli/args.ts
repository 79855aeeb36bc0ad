import { TensorLinkError } from '../errors.ts';
import type { StrategyName } from '../plan/index.ts';
import { STRATEGIES } from './options.ts';

/** A command line that cannot be run as written (unknown command or flag, bad value). */
export class UsageError extends TensorLinkError {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

export type Flags = Record<string, string | boolean | undefined>;

export function intFlag(flags: Flags, name: string, fallback: number, min = 1): number {
  const raw = flags[name];
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (typeof raw !== 'string' || !Number.isInteger(n) || n < min) throw new UsageError(`--${name} must be an integer ≥ ${min}, got '${raw}'`);
  return n;
}

export function optionalIntFlag(flags: Flags, name: string, min = 0): number | undefined {
  return flags[name] === undefined ? undefined : intFlag(flags, name, 0, min);
}

export function numberFlag(flags: Flags, name: string, fallback: number, min = 0): number {
  const raw = flags[name];
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (typeof raw !== 'string' || !Number.isFinite(n) || n < min) throw new UsageError(`--${name} must be a number ≥ ${min}, got '${raw}'`);
  return n;
}

export function stringFlag(flags: Flags, name: string): string | undefined {
  const raw = flags[name];
  if (raw === undefined) return undefined;
  if (typeof raw !== 'string' || raw === '') throw new UsageError(`--${name} needs a value`);
  return raw;
}

export function requiredString(flags: Flags, name: string): string {
  const v = stringFlag(flags, name);
  if (v === undefined) throw new UsageError(`--${name} is required`);
  return v;
}

/** Where a command runs: this process (--local 0), a local swarm of N workers, or an existing swarm. */
export type Placement = { kind: 'local' } | { kind: 'swarm'; workers: number } | { kind: 'remote'; bootstrap: string };

export function placement(flags: Flags): Placement {
  const bootstrap = stringFlag(flags, 'bootstrap');
  const local = flags.local === undefined ? undefined : intFlag(flags, 'local', 0, 0);
  if (bootstrap !== undefined && local !== undefined) throw new UsageError('give either --local N or --bootstrap MULTIADDR, not both');
  if (bootstrap !== undefined) return { kind: 'remote', bootstrap };
  if (local === undefined || local === 0) return { kind: 'local' };
  return { kind: 'swarm', workers: local };
}

/** Human byte sizes: "4GiB", "512MiB", "1000000". */
export function parseBytes(raw: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?$/i.exec(raw.trim());
  if (!m) throw new UsageError(`'${raw}' is not a size (e.g. 4GiB, 512MiB)`);
  const units: Record<string, number> = {
    b: 1,
    kib: 2 ** 10,
    mib: 2 ** 20,
    gib: 2 ** 30,
    tib: 2 ** 40,
    kb: 1e3,
    mb: 1e6,
    gb: 1e9,
    tb: 1e12,
  };
  return Math.round(Number(m[1]) * units[(m[2] ?? 'b').toLowerCase()]);
}

/** `--strategy` (a partition strategy's name) and `--privacy ends|none`, as generate and train take them. */
export function planFlags(flags: Flags, defaultStrategy: StrategyName): { strategy: StrategyName; privacy: 'ends' | 'none' } {
  const strategy = stringFlag(flags, 'strategy') ?? defaultStrategy;
  if (!(STRATEGIES as readonly string[]).includes(strategy)) throw new UsageError(`--strategy must be ${STRATEGIES.join(', ')}`);
  const privacy = stringFlag(flags, 'privacy') ?? 'ends';
  if (privacy !== 'ends' && privacy !== 'none') throw new UsageError('--privacy must be ends or none');
  return { strategy: strategy as StrategyName, privacy };
}

/**
 * `--redundancy K`, `--verify-rate P`, `--verify commit|exact` and `--chunk-rate P`, as train and generate take them:
 * with `--verify exact` no decoding step is checked by its commitments (every sampled one is re-run).
 */
export function verifyFlags(flags: Flags): { redundancy: number; sampleRate?: number; chunkRate?: number; exact?: boolean } {
  const redundancy = intFlag(flags, 'redundancy', 1);
  if (redundancy > 1 && flags.replicas !== undefined && flags.replicas !== '1') throw new UsageError('--redundancy and --replicas cannot be combined yet');
  const share = (flag: string) => {
    const raw = flags[flag];
    if (raw === undefined) return undefined;
    const p = numberFlag(flags, flag, 0);
    if (p > 1) throw new UsageError(`--${flag} is a share within [0, 1], got '${String(raw)}'`);
    return p;
  };
  const sampleRate = share('verify-rate');
  const mode = stringFlag(flags, 'verify') ?? 'commit';
  if (mode !== 'commit' && mode !== 'exact') throw new UsageError(`--verify is commit or exact, got '${mode}'`);
  const chunkRate = mode === 'exact' ? 0 : share('chunk-rate');
  return {
    redundancy, ...(sampleRate === undefined ? {} : { sampleRate }), ...(chunkRate === undefined ? {} : { chunkRate }),
    ...(mode === 'exact' ? { exact: true } : {}),
  };
}

/** Where `auto` serves a dashboard: this port on 127.0.0.1 when it is free, else any free one. */
export const DEFAULT_DASHBOARD_PORT = 8080;

/**
 * `[HOST:]PORT` (a dashboard's or an API's address): host 127.0.0.1 unless given; port 0 is any
 * free port; `auto` is DEFAULT_DASHBOARD_PORT, or any free port when that one is taken.
 */
export function hostPort(raw: string, flag: string): { host: string; port: number; fallback?: boolean } {
  if (raw === 'auto') return { host: '127.0.0.1', port: DEFAULT_DASHBOARD_PORT, fallback: true };
  const m = /^(?:(.+):)?(\d{1,5})$/.exec(raw.trim());
  const port = m ? Number(m[2]) : Number.NaN;
  if (!m || port > 65535) throw new UsageError(`--${flag} must be [HOST:]PORT with PORT in 0..65535 (0: any free port), got '${raw}'`);
  return { host: m[1] ?? '127.0.0.1', port };
}

/** `--dtype` and `--quantize`, checked: loadModel's options. */
export function weightFlags(flags: Flags): { dtype?: 'f32' | 'bf16'; quantize?: 'int8' | 'int4' } {
  const dtype = stringFlag(flags, 'dtype');
  const quantize = stringFlag(flags, 'quantize');
  if (dtype !== undefined && dtype !== 'f32' && dtype !== 'bf16') throw new UsageError(`--dtype must be f32 or bf16, not '${dtype}'`);
  if (quantize !== undefined && quantize !== 'int8' && quantize !== 'int4') throw new UsageError(`--quantize must be int8 or int4, not '${quantize}'`);
  return { ...(dtype ? { dtype } : {}), ...(quantize ? { quantize } : {}) };
}
