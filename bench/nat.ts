import type { ChildProcess } from 'node:child_process';
import { multiaddr } from '@multiformats/multiaddr';
import { launchNode } from '../src/swarm/index.ts';
import { createNode, pathTo, probe } from '../src/p2p/index.ts';
import { listWorkers } from '../src/user/index.ts';
import { type Home, natHome } from '../test/helpers/nat.ts';
import { hostMesh, type Mesh } from '../test/helpers/netns.ts';
import { waitFor } from '../test/helpers/processes.ts';
import type { Row } from './gemm.ts';

const SECTION = 'nat';
const TRIES = 7;
const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

/**
 * A worker on the "internet" (direct TCP) against one at home behind an nftables NAT router, reached directly over
 * WebRTC (signalled through the validator's relay) and through the relay itself (a second user that offers it only the
 * relayed address, as for a NAT WebRTC cannot get through), as users measure them: the median of 7 link probes (round
 * trips, then 256 KiB), between Linux network namespaces on this machine (no shaping: what each path's own cost is).
 * Needs root, iproute2 and nftables; skipped with a note otherwise.
 */
export async function benchNat(): Promise<Row[]> {
  let mesh: Mesh;
  let home: Home | undefined;
  try {
    mesh = hostMesh(3, { subnet: `11.${(process.pid % 200) + 20}.11`, publicRange: true });
  } catch (err) {
    process.stderr.write(`nat: skipped, it needs network namespaces: ${(err as Error).message}\n`);
    return [];
  }
  const children: ChildProcess[] = [];
  const user = await createNode({ listen: [`/ip4/${mesh.rootIp}/tcp/0`] });
  const relayUser = await createNode({ listen: [`/ip4/${mesh.rootIp}/tcp/0`] });
  try {
    home = natHome(mesh.hosts[2]);
    const anywhere = ['--listen', '/ip4/0.0.0.0/tcp/0', '--backend', 'js'];
    const validator = await launchNode(['validator', ...anywhere], 60_000, { prefix: mesh.hosts[0].exec });
    children.push(validator.process);
    const boot = validator.addrs.find((a) => a.startsWith(`/ip4/${mesh.hosts[0].ip}/`))!;
    const direct = await launchNode(['worker', '--bootstrap', boot, ...anywhere], 60_000, { prefix: mesh.hosts[1].exec });
    const relayed = await launchNode(['worker', '--bootstrap', boot, ...anywhere], 60_000, { prefix: home.host.exec });
    children.push(direct.process, relayed.process);
    const { value: listed } = await waitFor('both workers listed', async () => {
      const ws = await listWorkers(user, multiaddr(boot));
      const d = ws.find((w) => w.peerId === direct.peerId);
      const r = ws.find((w) => w.peerId === relayed.peerId && w.addrs.some((a) => a.includes('/p2p-circuit')));
      return d && r ? { d, r } : null;
    }, 40_000);
    const measure = async (from: typeof user, target: { peerId: string; addrs: string[] }, path: string) => {
      const runs = [];
      for (let i = 0; i < TRIES; i++) runs.push(await probe(from, target, { timeoutMs: 10_000 }));
      const took = pathTo(from, target.peerId);
      if (took !== path) throw new Error(`the probes to ${target.peerId} took the path ${took}, not ${path}`);
      return { mbps: median(runs.map((r) => r.mbps)), rttMs: median(runs.map((r) => r.rttMs)) };
    };
    const d = await measure(user, listed.d, 'direct');
    const w = await measure(user, listed.r, 'webrtc');
    // the relay takes users that asked its validator something (the registry, here)
    await listWorkers(relayUser, multiaddr(boot));
    const r = await measure(relayUser, { ...listed.r, addrs: listed.r.addrs.filter((a) => /\/p2p-circuit\/p2p\//.test(a)) }, 'relayed');
    const show = (x: { mbps: number; rttMs: number }) => `${x.mbps} Mbit/s, ${x.rttMs.toFixed(2)} ms`;
    process.stderr.write(`  nat: direct TCP ${show(d)}; WebRTC ${show(w)}; through the relay ${show(r)}\n`);
    const reference = 'a worker on a public address, direct TCP';
    const rows = (what: string, x: { mbps: number; rttMs: number }): Row[] => [
      { section: SECTION, case: `a worker behind NAT, ${what}: link probe rate`, value: x.mbps, unit: 'Mbit/s', reference, referenceValue: d.mbps, ratio: x.mbps / d.mbps },
      { section: SECTION, case: `a worker behind NAT, ${what}: round trip`, value: x.rttMs, unit: 'ms', reference, referenceValue: d.rttMs, ratio: x.rttMs / d.rttMs },
    ];
    return [...rows('direct over WebRTC', w), ...rows('through the validator\'s relay', r)];
  } finally {
    await user.stop();
    await relayUser.stop();
    for (const c of children) c.kill('SIGKILL');
    home?.remove();
    mesh.remove();
  }
}
