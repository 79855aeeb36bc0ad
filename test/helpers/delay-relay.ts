/**
 * A TCP relay that adds latency, for tests across hosts (test/helpers/netns.ts): the kernel's
 * `netem` is missing on our machines, so a link's delay is made in user space instead.
 *
 * Each accepted connection gets its own connection to the target; bytes go both ways, and every
 * chunk is held for `delayMs` before it is written on. The chunks of one direction form a delay
 * line: a chunk read at time t is written at t + delayMs, in order, however many are in flight,
 * so throughput is not divided by the delay (it is bounded by `maxHeldBytes / delayMs`, like a
 * TCP window). The end of a stream (FIN) is delayed as well; a reset or error on either side
 * destroys both.
 *
 * Runnable as its own process, for instance inside a host's namespace:
 * `ip netns exec NS node --import tsx test/helpers/delay-relay.ts --listen HOST:PORT --target HOST:PORT --delay MS`
 * prints one line `{"event":"ready","port":N}` when it listens, and stops on SIGTERM or SIGINT.
 */
import { realpathSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

export interface DelayRelayOptions {
  /** The address to listen on (default '127.0.0.1'). */
  listenHost?: string;
  /** The port to listen on; 0 (the default) takes any free one, see {@link DelayRelay.port}. */
  listenPort?: number;
  /** Where each accepted connection is relayed to (a port of 0: where setTarget says, connections held until then). */
  targetHost: string;
  targetPort: number;
  /** How long each chunk is held, in each direction, in ms: a round trip through the relay gains 2 × delayMs. */
  delayMs: number;
  /**
   * Bytes one direction may hold (in the delay line plus unsent on its socket) before the relay
   * stops reading from the sender; reading resumes below half of it. Default 8 MiB, which lets
   * 8 MiB / 50 ms = 1.3 Gbit/s through a 50 ms relay, more than a test's link needs.
   */
  maxHeldBytes?: number;
}

export interface DelayRelay {
  /** The port it listens on. */
  port: number;
  /** The port to relay to, for a relay made with a targetPort of 0: connections accepted before it wait for it. */
  setTarget(port: number): void;
  /** Holds what is read from now on for `ms` in each direction (chunks already in a delay line keep their time). */
  setDelay(ms: number): void;
  /** Stops listening and drops every relayed connection. */
  close(): Promise<void>;
}

/** 8 MiB: see {@link DelayRelayOptions.maxHeldBytes}. */
const DEFAULT_MAX_HELD_BYTES = 8 * 1024 * 1024;

/** A chunk in the delay line, or (chunk null) the end of the stream. */
interface Held {
  due: number;
  chunk: Buffer | null;
}

/** Forwards `from` to `to` through a delay line of `delayMs`. */
function delayLine(from: Socket, to: Socket, delay: { ms: number }, maxHeldBytes: number): void {
  const line: Held[] = [];
  let heldBytes = 0;
  let timer: NodeJS.Timeout | undefined;

  const backlog = () => heldBytes + to.writableLength;
  const resumeIfRoom = () => {
    if (from.isPaused() && backlog() <= maxHeldBytes / 2) from.resume();
  };
  const arm = () => {
    if (timer !== undefined || line.length === 0) return;
    // setTimeout may fire up to a ms before its time (libuv rounds to its loop clock): release() checks
    timer = setTimeout(release, Math.max(1, Math.ceil(line[0].due - performance.now())));
  };
  const release = () => {
    timer = undefined;
    const now = performance.now();
    while (line.length > 0 && line[0].due <= now) {
      const { chunk } = line.shift()!;
      if (to.destroyed) continue;
      if (chunk === null) {
        to.end();
      } else {
        heldBytes -= chunk.length;
        to.write(chunk);
      }
    }
    arm();
    resumeIfRoom();
  };

  from.on('data', (chunk: Buffer) => {
    line.push({ due: performance.now() + delay.ms, chunk });
    heldBytes += chunk.length;
    arm();
    if (backlog() > maxHeldBytes) from.pause();
  });
  from.on('end', () => {
    line.push({ due: performance.now() + delay.ms, chunk: null });
    arm();
  });
  to.on('drain', resumeIfRoom);
  // `from` may close (both its directions done) while its last chunks are still in the line: they
  // still go; only once `to` is gone is there nothing left to do
  to.on('close', () => clearTimeout(timer));
}

/**
 * Starts a relay that listens on `listenHost:listenPort` and forwards every connection to
 * `targetHost:targetPort`, holding each chunk for `delayMs` in each direction.
 *
 * @example
 * const relay = await startDelayRelay({ targetHost: '127.0.0.1', targetPort: server.port, delayMs: 50 });
 * const socket = connect(relay.port, '127.0.0.1'); // a round trip now takes at least 100 ms
 * after(() => relay.close());
 */
export async function startDelayRelay(options: DelayRelayOptions): Promise<DelayRelay> {
  const { listenHost = '127.0.0.1', listenPort = 0, targetHost, targetPort, delayMs } = options;
  const maxHeldBytes = options.maxHeldBytes ?? DEFAULT_MAX_HELD_BYTES;
  if (!(Number.isFinite(delayMs) && delayMs >= 0)) throw new RangeError(`delayMs must be a number >= 0, got ${delayMs}`);
  if (!(maxHeldBytes > 0)) throw new RangeError(`maxHeldBytes must be positive, got ${maxHeldBytes}`);
  const delay = { ms: delayMs };
  const sockets = new Set<Socket>();
  const track = (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  };

  let setTarget = (_port: number) => {};
  const target = targetPort > 0 ? Promise.resolve(targetPort) : new Promise<number>((resolve) => (setTarget = resolve));
  const server = createServer({ allowHalfOpen: true, noDelay: true }, async (client) => {
    track(client);
    // (a client's bytes wait in its socket, not read, until there is somewhere to send them; a reset before is its end)
    const early = () => client.destroy();
    client.on('error', early);
    const port = await target;
    client.off('error', early);
    if (client.destroyed) return;
    const upstream = connect({ host: targetHost, port, allowHalfOpen: true, noDelay: true });
    track(upstream);
    const fail = () => {
      client.destroy();
      upstream.destroy();
    };
    // a reset on either side resets the other; a clean end (FIN) travels through the delay line
    client.on('error', fail);
    upstream.on('error', fail);
    delayLine(client, upstream, delay, maxHeldBytes);
    delayLine(upstream, client, delay, maxHeldBytes);
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(listenPort, listenHost, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error(`delay relay: unexpected listening address ${address}`);

  return {
    port: address.port,
    setTarget: (port) => setTarget(port),
    setDelay(ms) {
      if (!(Number.isFinite(ms) && ms >= 0)) throw new RangeError(`delayMs must be a number >= 0, got ${ms}`);
      delay.ms = ms;
    },
    close: () => new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    }),
  };
}

/** "HOST:PORT" or "[V6]:PORT". */
function hostPort(flag: string, value: string | undefined): { host: string; port: number } {
  const m = value === undefined ? null : /^\[?([^\]]*?)\]?:(\d+)$/.exec(value);
  if (m === null) throw new Error(`--${flag} HOST:PORT is needed, got ${value}`);
  return { host: m[1], port: Number(m[2]) };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { listen: { type: 'string' }, target: { type: 'string' }, delay: { type: 'string' } },
  });
  const listen = hostPort('listen', values.listen);
  const target = hostPort('target', values.target);
  const delayMs = Number(values.delay);
  if (values.delay === undefined || !Number.isFinite(delayMs)) throw new Error(`--delay MS is needed, got ${values.delay}`);
  const relay = await startDelayRelay({
    listenHost: listen.host,
    listenPort: listen.port,
    targetHost: target.host,
    targetPort: target.port,
    delayMs,
  });
  for (const signal of ['SIGTERM', 'SIGINT'] as const) {
    process.once(signal, () => void relay.close().then(() => process.exit(0)));
  }
  process.stdout.write(`${JSON.stringify({ event: 'ready', port: relay.port })}\n`);
}

function isEntryPoint(): boolean {
  if (process.argv[1] === undefined) return false;
  try {
    return import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href;
  } catch {
    return false;
  }
}

if (isEntryPoint()) {
  main().catch((err: unknown) => {
    process.stderr.write(`delay-relay: ${(err as Error).message}\n`);
    process.exit(1);
  });
}
