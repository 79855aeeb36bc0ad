/**
 * Hosts for tests across machines, made of Linux network namespaces on this one machine.
 *
 * - `hostPair()`: two namespaces joined by one veth pair.
 * - `hostMesh(n)`: n namespaces on one switch (a Linux bridge in a namespace of its own), which
 *   the test process itself is also plugged into, with per-pair bandwidth limits (`shape`).
 *
 * Each host has its own loopback (127.0.0.1 on one is not the other) and one routable private
 * address, and no route anywhere else. Needs root and iproute2 (`ip`, and `tc` for shaping;
 * `.ci/run` installs them). Every name carries this process's pid so parallel test processes do
 * not collide. Latency is not added here (the kernel's `netem` is missing on our machines): put a
 * `startDelayRelay` (test/helpers/delay-relay.ts) in the path instead.
 */
import { execFileSync } from 'node:child_process';
import { InvalidArgumentError, TensorLinkError } from '../../src/errors.ts';

/** Namespaces cannot be made here: not root, no iproute2, or no tc (the message says which). */
export class NetnsUnavailableError extends TensorLinkError {
  constructor(message: string, options: { details?: Record<string, unknown>; cause?: unknown } = {}) {
    super(message, options);
    this.name = 'NetnsUnavailableError';
  }
}

export interface Host {
  /** The namespace's name, for `ip netns exec`. */
  ns: string;
  /** Its address on the link between the hosts. */
  ip: string;
  /** The command prefix that runs a program on this host: `['ip', 'netns', 'exec', ns]`. */
  exec: string[];
}

/**
 * Two Linux network namespaces joined by a veth pair: two hosts on one machine, each with its
 * own loopback (127.0.0.1 on one is not the other) and one routable address. Needs root and
 * iproute2 (`.ci/run` installs it); every name carries this process's pid so parallel runs
 * do not collide, and `remove()` deletes both namespaces (and with them the veth pair).
 */
export interface HostPair {
  hosts: [Host, Host];
  remove(): void;
}

/**
 * Hosts on one switch, made by {@link hostMesh}.
 */
export interface Mesh {
  /** hosts[0..n-1], each a namespace with lo up and ONE address `ip` on a shared switch (a Linux bridge). */
  hosts: Host[];
  /**
   * The address by which the root namespace (the test process itself) is on the same switch, so the test process can dial hosts
   * directly and hosts can dial it.
   */
  rootIp: string;
  /**
   * Limits the link between hosts a and b (both directions, and only that pair's traffic) to `mbit` Mbit/s with the kernel's tbf qdisc.
   * Index -1 means the root namespace. Can be called again to change or (mbit = null) remove the limit.
   */
  shape(a: number, b: number, mbit: number | null): void;
  /** Deletes every namespace, veth and bridge it made, and kills what still runs in its namespaces. Idempotent. */
  remove(): void;
}

/** Runs `cmd args`; returns its stdout, or throws an Error that quotes the command and its stderr. */
function sh(cmd: string, args: string[]): string {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { stderr?: string };
    const why = e.code === 'ENOENT' ? `${cmd} is not installed (iproute2 provides ip and tc)` : (e.stderr ?? '').trim() || e.message;
    throw new Error(`${cmd} ${args.join(' ')}: ${why}`, { cause: err });
  }
}

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** Kills what still runs in namespace `ns`: it would keep the namespace (and its interfaces) alive after `netns del`. */
export function killIn(ns: string): void {
  let pids: string[] = [];
  try {
    pids = execFileSync('ip', ['netns', 'pids', ns], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).split(/\s+/).filter(Boolean);
  } catch {
    // no such namespace
  }
  for (const p of pids) {
    try {
      process.kill(Number(p), 'SIGKILL');
    } catch {
      // exited meanwhile
    }
  }
}

/** Runs a command whose failure only means "there was nothing to delete". */
function quietly(cmd: string, args: string[]): void {
  try {
    execFileSync(cmd, args, { stdio: 'ignore' });
  } catch {
    // already gone, or never made
  }
}

export function hostPair(subnet = '10.77.0'): HostPair {
  const tag = `${process.pid % 100_000}`;
  const names = [`tl-a-${tag}`, `tl-b-${tag}`];
  const links = [`tla${tag}`, `tlb${tag}`];
  const remove = () => {
    for (const ns of names) {
      try {
        ip('netns', 'del', ns);
      } catch {
        // already gone
      }
    }
  };
  remove();
  try {
    for (const ns of names) ip('netns', 'add', ns);
    ip('link', 'add', links[0], 'type', 'veth', 'peer', 'name', links[1]);
    const hosts = names.map((ns, i): Host => {
      const addr = `${subnet}.${i + 1}`;
      ip('link', 'set', links[i], 'netns', ns);
      ip('-n', ns, 'addr', 'add', `${addr}/24`, 'dev', links[i]);
      ip('-n', ns, 'link', 'set', links[i], 'up');
      ip('-n', ns, 'link', 'set', 'lo', 'up');
      return { ns, ip: addr, exec: ['ip', 'netns', 'exec', ns] };
    });
    return { hosts: [hosts[0], hosts[1]], remove };
  } catch (err) {
    remove();
    throw new Error(`cannot create network namespaces (root and iproute2 are needed): ${(err as Error).message}`, { cause: err });
  }
}

// ---- hostMesh -------------------------------------------------------------------------------

/** The most hosts on one /24: .1 to .253 for hosts, .254 for the root namespace. */
const MAX_HOSTS = 253;
/**
 * tbf's queue: a packet that would wait longer than this is dropped. 50 ms is a WAN-like buffer:
 * enough for a few TCP flows (on its own host a TCP socket keeps only ~1 ms of data in the qdisc,
 * TCP small queues), and it bounds the queuing delay that a saturated link adds to a ping.
 */
const TBF_LATENCY = '50ms';
/**
 * tbf's bucket, in bytes: rate × 4 ms, at least 4 KiB. The kernel refills it with high-resolution
 * timers, so it needs no HZ-sized bucket; a small one keeps the rate exact over short transfers
 * (the bucket is the burst a link lets through at wire speed after an idle spell: 4 KiB is 33 ms
 * at 1 Mbit/s, 50 KiB is 4 ms at 100 Mbit/s). It must hold one full frame (1514 bytes) or every
 * full-size packet is dropped; TSO super-packets larger than it are cut into frames by tbf.
 */
function tbfBurst(mbit: number): number {
  return Math.max(4096, Math.ceil((mbit * 1e6 / 8) * 0.004));
}

const PRIVATE = [
  { net: [10, 0, 0, 0], len: 8 },
  { net: [172, 16, 0, 0], len: 12 },
  { net: [192, 168, 0, 0], len: 16 },
];

function toInt(octets: number[]): number {
  return ((octets[0] << 24) | (octets[1] << 16) | (octets[2] << 8) | octets[3]) >>> 0;
}

function prefixMask(len: number): number {
  return len === 0 ? 0 : (~0 << (32 - len)) >>> 0;
}

function overlaps(a: number, aLen: number, b: number, bLen: number): boolean {
  const mask = prefixMask(Math.min(aLen, bLen));
  return ((a & mask) >>> 0) === ((b & mask) >>> 0);
}

/** Routes of the root namespace's main table, as [network, prefix length, device]. */
function rootRoutes(): { net: number; len: number; dev: string }[] {
  const routes = JSON.parse(sh('ip', ['-4', '-j', 'route', 'show'])) as { dst: string; dev?: string }[];
  return routes
    .filter((r) => r.dst !== 'default')
    .map((r) => {
      const [addr, len] = r.dst.split('/');
      return { net: toInt(addr.split('.').map(Number)), len: len === undefined ? 32 : Number(len), dev: r.dev ?? '?' };
    });
}

/** The root namespace's route that the /24 `subnet` would clash with, if any. */
function clash(subnet: string): string | undefined {
  const net = toInt([...subnet.split('.').map(Number), 0]);
  const r = rootRoutes().find((route) => overlaps(route.net, route.len, net, 24));
  return r && `dev ${r.dev}`;
}

/**
 * Checks an explicit subnet ("10.78.5"): three octets of a private /24 that the root namespace does not route yet, or
 * (`publicRange`) of 11.0.0.0/8, a public range for tests of public addresses (isolated: the mesh routes it nowhere).
 */
function checkSubnet(subnet: string, publicRange = false): void {
  const octets = subnet.split('.').map(Number);
  if (octets.length !== 3 || octets.some((o) => !Number.isInteger(o) || o < 0 || o > 255) || !/^[\d.]+$/.test(subnet)) {
    throw new InvalidArgumentError(`subnet must be three octets of a /24 such as '10.78.5', got '${subnet}'`, { details: { subnet } });
  }
  const net = toInt([...octets, 0]);
  if (publicRange) {
    if (octets[0] !== 11) throw new InvalidArgumentError(`a public test subnet is in 11.0.0.0/8, got '${subnet}'`, { details: { subnet } });
    if (clash(subnet) !== undefined) throw new NetnsUnavailableError(`${subnet}.0/24 is routed in the root namespace already (${clash(subnet)})`);
    return;
  }
  if (!PRIVATE.some((p) => overlaps(toInt(p.net), p.len, net, 24))) {
    throw new InvalidArgumentError(`subnet ${subnet}.0/24 is not a private range (10/8, 172.16/12, 192.168/16)`, { details: { subnet } });
  }
}

/** A free /24 in 10.78/16, starting from one derived from the pid so parallel processes rarely try the same. */
function freeSubnet(): string {
  for (let i = 0; i < 256; i++) {
    const subnet = `10.78.${(process.pid + i) % 256}`;
    if (clash(subnet) === undefined) return subnet;
  }
  throw new NetnsUnavailableError('no free /24 in 10.78.0.0/16 in the root namespace: leftovers of earlier runs? (ip route)');
}

/** How many meshes this process has made: the last part of their names. */
let meshes = 0;

/**
 * Makes `n` hosts on one switch: a Linux bridge in its own namespace (`tl-sw-<pid>-<k>`, k counts
 * this process's meshes), one namespace per host (`tl-h<i>-<pid>-<k>`, its interface `eth0`,
 * address `<subnet>.<i+1>`), and one veth from the root namespace (`tl<pid>r<k>`, address
 * `<subnet>.254`) so that the test process can
 * dial the hosts and they can dial it. Leftovers with the same names are removed first; `remove()`
 * runs on process exit as well, but call it in `after()`.
 *
 * Shaping (`shape(a, b, mbit)`): the egress of a's interface gets an `htb` root qdisc used only to
 * sort packets (this kernel has no `prio`): a `u32` filter per shaped peer (`match ip dst <b>/32`)
 * sends that peer's packets to a class of its own, whose rate (10 Gbit/s) is above what a test
 * pushes through a veth and whose leaf qdisc is `tbf rate <mbit>mbit`, the actual limit; b's interface gets the same toward a.
 * htb has no default class, so unmatched packets (other hosts, ARP) take its direct queue, which
 * is never shaped; a tbf leaf holds its packets back until tokens come, and htb meanwhile serves
 * the direct queue and the other classes, so no other traffic waits behind a shaped link.
 * Rates count whole Ethernet frames: TCP's goodput is about 96 % of `mbit`.
 *
 * @param n - how many hosts, 1 to 253
 * @param options.subnet - three octets of a private /24 ('10.78.5'); by default a free one in 10.78/16
 * @throws NetnsUnavailableError when namespaces cannot be made (not root, no iproute2)
 * @example
 * const mesh = hostMesh(3);
 * after(() => mesh.remove());
 * mesh.shape(0, 1, 10); // host 0 <-> host 1 at 10 Mbit/s, every other pair at memory speed
 * spawn(mesh.hosts[0].exec[0], [...mesh.hosts[0].exec.slice(1), process.execPath, 'server.js']);
 */
export function hostMesh(n: number, options: { subnet?: string; publicRange?: boolean } = {}): Mesh {
  if (!Number.isInteger(n) || n < 1 || n > MAX_HOSTS) {
    throw new InvalidArgumentError(`hostMesh needs 1 to ${MAX_HOSTS} hosts, got ${n}`, { details: { n } });
  }
  if (options.subnet !== undefined) checkSubnet(options.subnet, options.publicRange);
  const pid = process.pid;
  const k = meshes++; // several meshes may live in one process at once
  const sw = `tl-sw-${pid}-${k}`;
  const names = Array.from({ length: n }, (_, i) => `tl-h${i}-${pid}-${k}`);
  const rootDev = `tl${pid}r${k}`; // at most 15 characters: pids are below 2^22
  const bridge = 'br0';

  const teardown = (): void => {
    for (const ns of [...names, sw]) killIn(ns);
    // deleted here rather than with the switch's namespace: that one goes away asynchronously
    quietly('ip', ['link', 'del', rootDev]);
    for (const ns of [...names, sw]) quietly('ip', ['netns', 'del', ns]);
  };

  let removed = false;
  const remove = (): void => {
    if (removed) return;
    removed = true;
    process.off('exit', remove);
    teardown();
  };

  teardown();
  let subnet: string;
  let hosts: Host[];
  try {
    subnet = options.subnet ?? freeSubnet();
    const taken = clash(subnet);
    if (taken !== undefined) {
      throw new InvalidArgumentError(`subnet ${subnet}.0/24 is already routed in the root namespace (${taken})`, { details: { subnet } });
    }
    sh('ip', ['netns', 'add', sw]);
    sh('ip', ['-n', sw, 'link', 'add', bridge, 'type', 'bridge']);
    sh('ip', ['-n', sw, 'link', 'set', bridge, 'up']);
    hosts = names.map((ns, i): Host => {
      const addr = `${subnet}.${i + 1}`;
      const port = `h${i}`;
      sh('ip', ['netns', 'add', ns]);
      sh('ip', ['link', 'add', 'eth0', 'netns', ns, 'type', 'veth', 'peer', 'name', port, 'netns', sw]);
      sh('ip', ['-n', sw, 'link', 'set', port, 'master', bridge, 'up']);
      sh('ip', ['-n', ns, 'addr', 'add', `${addr}/24`, 'dev', 'eth0']);
      sh('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
      sh('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
      return { ns, ip: addr, exec: ['ip', 'netns', 'exec', ns] };
    });
    sh('ip', ['link', 'add', rootDev, 'type', 'veth', 'peer', 'name', 'root', 'netns', sw]);
    sh('ip', ['-n', sw, 'link', 'set', 'root', 'master', bridge, 'up']);
    sh('ip', ['addr', 'add', `${subnet}.254/24`, 'dev', rootDev]);
    sh('ip', ['link', 'set', rootDev, 'up']);
  } catch (err) {
    teardown();
    if (err instanceof InvalidArgumentError || err instanceof NetnsUnavailableError) throw err;
    const uid = process.getuid?.();
    const hint = uid !== undefined && uid !== 0 ? ' (this process is not root: namespaces need root or CAP_SYS_ADMIN)' : '';
    throw new NetnsUnavailableError(`cannot create network namespaces: ${(err as Error).message}${hint}`, { cause: err });
  }
  process.on('exit', remove);
  const rootIp = `${subnet}.254`;

  // side (host index, or -1 for the root namespace) -> shaped peer -> Mbit/s
  const limits = new Map<number, Map<number, number>>();
  const ipOf = (side: number): string => (side === -1 ? rootIp : hosts[side].ip);

  /** Rebuilds one side's egress qdiscs from `limits`: simpler than editing them, and shaping changes rarely. */
  const apply = (side: number): void => {
    const where = side === -1 ? ['dev', rootDev] : ['dev', 'eth0'];
    const tc = (...args: string[]) => sh('tc', side === -1 ? args : ['-n', names[side], ...args]);
    quietly('tc', side === -1 ? ['qdisc', 'del', ...where, 'root'] : ['-n', names[side], 'qdisc', 'del', ...where, 'root']);
    const peers = [...(limits.get(side) ?? new Map<number, number>()).entries()];
    if (peers.length === 0) return;
    // no default class: unmatched packets take htb's direct queue, which is never shaped
    tc('qdisc', 'add', ...where, 'root', 'handle', '1:', 'htb');
    for (const [k, [peer, mbit]] of peers.entries()) {
      const id = (0x10 + k).toString(16); // class and qdisc ids are hex
      // the class only sorts packets: its rate is above what Node pushes through a veth (~2 Gbit/s), so tbf alone sets the pace
      tc('class', 'add', ...where, 'parent', '1:', 'classid', `1:${id}`, 'htb', 'rate', '10gbit', 'burst', '1mb', 'quantum', '65536');
      const rate = `${Math.round(mbit * 1e6)}bit`;
      tc('qdisc', 'add', ...where, 'parent', `1:${id}`, 'handle', `${id}:`, 'tbf', 'rate', rate, 'burst', `${tbfBurst(mbit)}`, 'latency', TBF_LATENCY);
      tc('filter', 'add', ...where, 'parent', '1:', 'protocol', 'ip', 'prio', '1', 'u32', 'match', 'ip', 'dst', `${ipOf(peer)}/32`, 'flowid', `1:${id}`);
    }
  };

  const shape = (a: number, b: number, mbit: number | null): void => {
    for (const side of [a, b]) {
      if (!Number.isInteger(side) || side < -1 || side >= n) {
        throw new InvalidArgumentError(`shape: host index ${side} is not -1 (root) or 0..${n - 1}`, { details: { a, b } });
      }
    }
    if (a === b) throw new InvalidArgumentError(`shape: a link needs two ends, got ${a} twice`, { details: { a, b } });
    if (mbit !== null && !(Number.isFinite(mbit) && mbit > 0)) {
      throw new InvalidArgumentError(`shape: mbit must be a positive number or null, got ${mbit}`, { details: { mbit } });
    }
    if (removed) throw new InvalidArgumentError('shape: this mesh has been removed');
    for (const [from, to] of [[a, b], [b, a]]) {
      const peers = limits.get(from) ?? new Map<number, number>();
      if (mbit === null) peers.delete(to);
      else peers.set(to, mbit);
      limits.set(from, peers);
    }
    try {
      apply(a);
      apply(b);
    } catch (err) {
      throw new NetnsUnavailableError(`cannot shape the link ${a} <-> ${b}: ${(err as Error).message}`, { cause: err });
    }
  };

  return { hosts, rootIp, shape, remove };
}
