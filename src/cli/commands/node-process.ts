/** What the long-running node commands (validator, worker, swarm, chain, serve) share: flag checks, the ready line, how they end. */
import { multiaddr } from '@multiformats/multiaddr';
import { isLogLevel, type LogLevel, Validators } from '../../p2p/index.ts';
import { type Flags, intFlag, stringFlag, UsageError } from '../args.ts';

export function parseAddr(raw: string, flag: string) {
  try {
    return multiaddr(raw);
  } catch {
    throw new UsageError(`--${flag} '${raw}' is not a multiaddr (e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3...)`);
  }
}

/** `--bootstrap`'s validators: one multiaddr, or several separated by commas (a request moves on when one is gone). */
export function validatorsFlag(raw: string): Validators {
  try {
    return Validators.parse(raw);
  } catch (err) {
    throw new UsageError(`--bootstrap: ${(err as Error).message}`);
  }
}

/** `--announce ADDR` (repeatable): addresses a node announces besides its interfaces' (each a multiaddr without /p2p). */
export function announceFlags(flags: Flags): string[] {
  const all = (flags.announce as string[] | undefined) ?? [];
  for (const a of all) {
    const ma = parseAddr(a, 'announce');
    if (ma.getComponents().some((c) => c.name === 'p2p')) throw new UsageError(`--announce '${a}': give the address without /p2p/… (the node adds its own id)`);
  }
  return all;
}

/**
 * Runs until SIGINT/SIGTERM — or, with `--parent-pid` (set by a local swarm), until that
 * process is gone, so a swarm killed with SIGKILL leaves no node behind — then stops the node.
 */
export function runUntilSignal(stop: () => Promise<void>, flags: Flags = {}): Promise<void> {
  const parent = flags['parent-pid'] === undefined ? null : intFlag(flags, 'parent-pid', 1);
  return new Promise((resolve) => {
    let watch: ReturnType<typeof setInterval> | null = null;
    const done = () => {
      if (watch) clearInterval(watch);
      stop().finally(resolve);
    };
    process.once('SIGINT', done);
    process.once('SIGTERM', done);
    if (parent !== null) {
      watch = setInterval(() => {
        try {
          process.kill(parent, 0);
        } catch {
          done();
        }
      }, 500);
    }
  });
}

export function logLevel(flags: Flags): LogLevel {
  const raw = stringFlag(flags, 'log-level') ?? 'warn';
  if (!isLogLevel(raw)) throw new UsageError('--log-level must be debug, info, warn, error or silent');
  return raw;
}

export function ready(peerId: string, addrs: string[], account?: string, dashboard?: string): void {
  process.stdout.write(`${JSON.stringify({ event: 'ready', peerId, addrs, ...(account ? { account } : {}), ...(dashboard ? { dashboard } : {}) })}\n`);
}
