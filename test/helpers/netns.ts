import { execFileSync } from 'node:child_process';

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

export interface Host {
  /** The namespace's name, for `ip netns exec`. */
  ns: string;
  /** Its address on the link between the two. */
  ip: string;
  /** The command prefix that runs a program on this host. */
  exec: string[];
}

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
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
