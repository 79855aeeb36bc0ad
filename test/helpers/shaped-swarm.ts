import type { Libp2p } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { launchNode, type NodeProcess } from '../../src/swarm/index.ts';
import { createNode, type PeerRecord } from '../../src/p2p/index.ts';
import { listPeers, listWorkers } from '../../src/user/index.ts';
import { hostMesh, type Mesh } from './netns.ts';
import { waitFor } from './processes.ts';

/** A swarm across hosts with one slow link, once every worker has measured every other since it was slowed. */
export interface ShapedSwarm {
  mesh: Mesh;
  /** The user: this process, on the hosts' switch. */
  user: Libp2p;
  boot: string;
  /** The workers' peer ids in the validator's order; the link between the first two is the slow one. */
  order: string[];
  /** The workers' records (their measured links) from the validator, by peer id. */
  records: Map<string, PeerRecord>;
  /** Milliseconds from the shaping to every worker's fresh measurement of every other. */
  measuredMs: number;
  /** The workers' records as the validator has them now. */
  refresh(): Promise<Map<string, PeerRecord>>;
  /** Stops the user and every node, and removes the hosts. */
  stop(): Promise<void>;
}

/**
 * A validator and three workers (js) each in a Linux network namespace on one switch, the user in
 * this process on the switch too, and the link between the first two workers the validator lists
 * (the two parameter-balanced chains first) limited to `mbit` Mbit/s by tbf. Throws
 * NetnsUnavailableError where namespaces cannot be made (not root, no iproute2).
 */
export async function shapedSwarm(mbit: number): Promise<ShapedSwarm> {
  const mesh = hostMesh(3);
  const nodes: NodeProcess[] = [];
  let user: Libp2p | null = null;
  const stop = async () => {
    await user?.stop();
    for (const n of nodes) n.process.kill('SIGKILL');
    mesh.remove();
  };
  try {
    const { hosts } = mesh;
    const anywhere = ['--listen', '/ip4/0.0.0.0/tcp/0', '--backend', 'js'];
    const validator = await launchNode(['validator', ...anywhere], 60_000, { prefix: hosts[0].exec });
    nodes.push(validator);
    const boot = validator.addrs.find((x) => x.includes(`/ip4/${hosts[0].ip}/`))!;
    const workers = await Promise.all(hosts.map((h) => launchNode(['worker', '--bootstrap', boot, ...anywhere], 60_000, { prefix: h.exec })));
    nodes.push(...workers);
    const hostOf = new Map(workers.map((w, i) => [w.peerId, i]));
    const u = (user = await createNode({ listen: [`/ip4/${mesh.rootIp}/tcp/0`] }));
    const refresh = async () => new Map((await listPeers(u, multiaddr(boot))).map((p) => [p.peerId, p]));
    const order = (await waitFor('three workers', async () => {
      const ws = await listWorkers(u, multiaddr(boot));
      return ws.length === 3 && ws;
    }, 30_000)).value.map((w) => w.peerId);
    const shapedAt = Date.now();
    mesh.shape(hostOf.get(order[0])!, hostOf.get(order[1])!, mbit);
    // a probe under way when the shaping came may end after it and still read fast: the shaped pair must read slow both ways
    const slowBothWays = (recs: Map<string, PeerRecord>) => [[order[0], order[1]], [order[1], order[0]]]
      .every(([x, y]) => (recs.get(x)?.proximity[y]?.mbps ?? Infinity) < 3 * mbit);
    // and the other links read fast: a probe is CPU-bound on a loaded machine (CI runs three files at once on two cores,
    // Chromium's tabs among them) and reads an unshaped link at tens of Mbit/s; a later round (every 10 s) reads it again
    const shaped = (x: string, y: string) => (x === order[0] && y === order[1]) || (x === order[1] && y === order[0]);
    const fastElsewhere = (recs: Map<string, PeerRecord>) => {
      const slow = Math.max(...[[order[0], order[1]], [order[1], order[0]]].map(([x, y]) => recs.get(x)?.proximity[y]?.mbps ?? Infinity));
      return order.every((x) => order.every((y) => x === y || shaped(x, y) || (recs.get(x)?.proximity[y]?.mbps ?? 0) > 2 * slow));
    };
    const measured = await waitFor('every worker to measure every other after the shaping', async () => {
      const recs = await refresh();
      const after = order.every((x) => order.every((y) => x === y || (recs.get(x)?.proximity[y]?.measuredAt ?? 0) > shapedAt));
      return after && slowBothWays(recs) && fastElsewhere(recs) && recs;
    }, 45_000);
    return { mesh, user: u, boot, order, records: measured.value, measuredMs: measured.ms, refresh, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
