import { randomUUID } from 'node:crypto';
import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError, PlanInfeasibleError } from '../errors.ts';
import type { DialTarget } from '../p2p/index.ts';
import type { Plan } from '../plan/index.ts';
import { measuredRoute } from './hosted-routing.ts';
import type { JobStage, Placement } from './job-stage.ts';
import { listPeers } from './peers.ts';
import { findHosted } from './pull-ends.ts';
import { RemoteStage } from './remote-stage.ts';
import type { UserModel } from './user-model.ts';

/**
 * Places an adapter job over the hosts of a model they host for everyone (`worker --host`), instead of private copies:
 * the route with the least predicted latency over the hosts of `name` (as a hosted session's, by measured round
 * trips; none in `avoid`), one section per host's span, each opened as a job on its host. Each section then loads
 * over the host's blocks (`base`: the model's hash), sharing them with every other job and session there; only the
 * job's adapter factors are sent. The user holds the ends (privacy 'ends'). Returns the placement and the model's hash.
 */
export async function placeOnHosts(
  node: Libp2p,
  validator: DialTarget,
  source: UserModel,
  name: string,
  avoid: ReadonlySet<string> = new Set(),
  jobId: string = randomUUID(),
): Promise<Placement & { base: string }> {
  const [model, hash] = name.split('@', 2);
  const entry = await findHosted(node, validator, model, hash);
  if (entry.layers !== source.config.layers) {
    throw new InvalidArgumentError(`'${model}' as hosted has ${entry.layers} blocks; the model given has ${source.config.layers}: not the same model`);
  }
  const peers = await listPeers(node, validator);
  const hosts = new Set(entry.hosts.map((h) => h.peerId));
  const route = await measuredRoute(node, entry, peers, peers.filter((p) => hosts.has(p.peerId)), { avoid });
  if (!route) throw new PlanInfeasibleError(`the online hosts of '${model}' do not cover its ${entry.layers} blocks${avoid.size ? ` without the ${avoid.size} avoided` : ''}`);
  const sections: JobStage[][] = [];
  try {
    for (const hop of route) {
      // blocks b..c are our layers b + 1..c + 1 (0 is the embedding)
      const where = { peerId: hop.peerId, addrs: hop.addrs, start: hop.layers[0] + 1, end: hop.layers[1] + 2, replica: 0 };
      sections.push([{ where, remote: await RemoteStage.open(node, { peerId: hop.peerId, addrs: hop.addrs }, jobId) }]);
    }
  } catch (err) {
    await Promise.all(sections.flat().map((s) => s.remote.close()));
    throw err;
  }
  // the plan a job reports: the hosts' spans as its stages (their times are the hosts' to predict)
  const plan: Plan = {
    strategy: 'layer-aware',
    stages: route.map((hop) => ({ device: hop.peerId, start: hop.layers[0], end: hop.layers[1] + 1, params: 0, bytes: 0, seconds: 0 })),
    bottleneckSeconds: 0,
  };
  return { jobId, plan, sections, base: entry.hash };
}
