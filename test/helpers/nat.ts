/**
 * Homes behind NAT routers, made of Linux network namespaces and nftables on this one machine: a router is a host of
 * a mesh (test/helpers/netns.ts, its `eth0` on the "internet"), and `natHome(router)` puts a private LAN behind it with
 * one host. The router masquerades the LAN's traffic onto its public address and drops everything that comes in
 * unsolicited (only replies to what the home sent pass): nobody outside can dial the home, as behind a home router.
 * That includes what is sent to the router itself: a packet it took for itself would leave a conntrack entry on the
 * port a hole punch needs, and Linux's NAT would then map the home's next flow to that peer from another port.
 * `fullyRandom` picks a random source port for every new flow (a symmetric NAT, where hole punching fails). Needs root,
 * iproute2 and nftables (`.ci/run` installs them).
 */
import { execFileSync } from 'node:child_process';
import { type Host, killIn } from './netns.ts';

export interface Home {
  /** The host in the home (its namespace, its private address, and the prefix that runs a program there). */
  host: Host;
  /** Bytes the home sent to `ip` and received from it (any port, TCP or UDP) through its router, since the first call for `ip`. */
  bytesWith(ip: string): number;
  remove(): void;
}

let homes = 0;

function run(cmd: string, args: string[], input?: string): void {
  try {
    execFileSync(cmd, args, { stdio: [input === undefined ? 'ignore' : 'pipe', 'ignore', 'pipe'], ...(input === undefined ? {} : { input }) });
  } catch (err) {
    const e = err as { stderr?: Buffer };
    throw new Error(`${cmd} ${args.join(' ')}: ${e.stderr?.toString().trim() ?? (err as Error).message}`, { cause: err });
  }
}

function quietly(cmd: string, args: string[]): void {
  try {
    execFileSync(cmd, args, { stdio: 'ignore' });
  } catch {
    // already gone
  }
}

/** A home LAN 192.168.<k>.0/24 behind `router`: the router at .1 (NAT), one host at .2 routed through it. */
export function natHome(router: Host, options: { fullyRandom?: boolean } = {}): Home {
  const k = 100 + (homes++ % 100);
  const tag = `${process.pid % 100_000}-${k}`;
  const ns = `tl-home-${tag}`;
  const [lan, inside] = [`tlr${process.pid % 100_000}h${k}`, `tlh${process.pid % 100_000}h${k}`];
  const remove = () => {
    killIn(ns);
    quietly('ip', ['-n', router.ns, 'link', 'del', lan]);
    quietly('ip', ['netns', 'del', ns]);
  };
  remove();
  const net = `192.168.${k}`;
  try {
    run('ip', ['netns', 'add', ns]);
    run('ip', ['link', 'add', lan, 'netns', router.ns, 'type', 'veth', 'peer', 'name', inside, 'netns', ns]);
    run('ip', ['-n', router.ns, 'addr', 'add', `${net}.1/24`, 'dev', lan]);
    run('ip', ['-n', router.ns, 'link', 'set', lan, 'up']);
    run('ip', ['-n', ns, 'addr', 'add', `${net}.2/24`, 'dev', inside]);
    run('ip', ['-n', ns, 'link', 'set', inside, 'up']);
    run('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
    run('ip', ['-n', ns, 'route', 'add', 'default', 'via', `${net}.1`]);
    run('ip', ['netns', 'exec', router.ns, 'sysctl', '-q', '-w', 'net.ipv4.ip_forward=1']);
    const rules = `
table ip tlnat {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "eth0" ip saddr ${net}.0/24 masquerade${options.fullyRandom ? ' fully-random' : ''}
  }
  chain forward {
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "${lan}" oifname "eth0" accept
  }
  chain input {
    type filter hook input priority filter; policy accept;
    iifname "eth0" ct state established,related accept
    iifname "eth0" drop
  }
}
`;
    run('ip', ['netns', 'exec', router.ns, 'nft', '-f', '-'], rules);
  } catch (err) {
    remove();
    throw err;
  }
  // a named nftables counter per peer address, counting what the home sends there and receives from there (rules without
  // a verdict fall through)
  const counted = new Set<string>();
  const bytesWith = (ip: string): number => {
    const name = `with_${ip.replaceAll('.', '_')}`;
    const nft = (...args: string[]) => run('ip', ['netns', 'exec', router.ns, 'nft', ...args]);
    if (!counted.has(ip)) {
      nft('add', 'counter', 'ip', 'tlnat', name);
      nft('insert', 'rule', 'ip', 'tlnat', 'forward', 'iifname', lan, 'ip', 'daddr', ip, 'counter', 'name', name);
      nft('insert', 'rule', 'ip', 'tlnat', 'forward', 'oifname', lan, 'ip', 'saddr', ip, 'counter', 'name', name);
      counted.add(ip);
    }
    const out = execFileSync('ip', ['netns', 'exec', router.ns, 'nft', '-j', 'list', 'counter', 'ip', 'tlnat', name], { encoding: 'utf8' });
    const entry = (JSON.parse(out) as { nftables: { counter?: { bytes: number } }[] }).nftables.find((e) => e.counter);
    return entry?.counter?.bytes ?? 0;
  };
  return { host: { ns, ip: `${net}.2`, exec: ['ip', 'netns', 'exec', ns] }, bytesWith, remove };
}
