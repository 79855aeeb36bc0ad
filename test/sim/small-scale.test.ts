// Issue #50's small-scale check: the simulation against real processes.
// - Training: six worker processes (each offering the memory it is told) and a validator; a user plans a training job
//   over them with distribute, and the simulation's placement (src/sim/training.ts) is handed what that user saw (the
//   registry's records, the links it measured): it makes the same plan, worker for worker and layer for layer.
// - Hosting: five `worker --host-auto` processes join one after another and place themselves over a model; the
//   simulation's hosts (src/sim/hosted.ts: chooseSpan), joining in the same order with the same memory and speeds,
//   take the same spans. Each host is reached through a delay relay; the hosts of the route taken when every round
//   trip is alike are then put 80 ms away, and the user's router, pinging them through the relays, takes the route the
//   simulation counts as the best with those round trips (a simulated user of 6 hosts pings them all, and routes so).
// The simulation's jobs and hosts are placed by this same code at 10,000 peers.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { multiaddr } from '@multiformats/multiaddr';
import { peerIdFromString } from '@libp2p/peer-id';
import { createModel, gpt2Config, llamaConfig, partHeldBytes, saveModel } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { layerCosts, measuredLinks } from '../../src/plan/index.ts';
import { chooseSpan, placeTraining, type Spans } from '../../src/sim/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { distribute, listModels, listWorkers, plannedSwarm, routeOver } from '../../src/user/index.ts';
import { measuredRoute } from '../../src/user/hosted-routing.ts';
import { sectionCost } from '../../src/verify/index.ts';
import { BLOCK_MEMORY_SHARE } from '../../src/worker/placement.ts';
import { type DelayRelay, startDelayRelay } from '../helpers/delay-relay.ts';
import { type Running, startNode, waitFor } from '../helpers/processes.ts';

/** A host's own listening TCP port on the loopback (not its relay's, which it announces too). */
function ownPort(host: Running, relay: DelayRelay): number {
  const own = host.addrs.map((a) => /^\/ip4\/127\.0\.0\.1\/tcp\/(\d+)\/p2p\//.exec(a))
    .find((m) => m !== null && Number(m[1]) !== relay.port);
  if (!own) throw new Error(`no loopback TCP address of its own among ${host.addrs.join(', ')}`);
  return Number(own[1]);
}

describe('the simulation against real processes, at 6 peers', () => {
  setBackend('js');
  const nodes: Running[] = [];
  after(() => {
    for (const n of nodes) if (n.child.exitCode === null) n.child.kill('SIGKILL');
  });

  test('the simulation\'s placement, given what a real user saw, makes the plan distribute made over six worker processes', async (t) => {
    // blocks of 3 MiB of weights, 25 MiB with a verified training job's gradients, moments and copies: a worker of
    // 40 MiB holds one, of 64 MiB two, of 100 MiB three; six blocks must spread over several workers
    const config = gpt2Config({ vocabSize: 257, hidden: 256, layers: 6, heads: 4, maxPositions: 64 });
    const validator = await startNode(['validator', '--backend', 'js']);
    nodes.push(validator);
    const boot = validator.addrs[0];
    for (const memory of ['64MiB', '40MiB', '64MiB', '100MiB', '40MiB', '64MiB']) {
      nodes.push(await startNode(['worker', '--bootstrap', boot, '--backend', 'js', '--memory', memory]));
    }
    const user = await createNode();
    try {
      await waitFor('six workers', async () => (await listWorkers(user, multiaddr(boot))).length === 6, 20_000);
      const records = await listWorkers(user, multiaddr(boot));
      const model = createModel(config, { seed: 3 });
      const dm = await distribute(user, boot, model, { training: true });
      try {
        const real = dm.plan.stages.map((s) => `${s.device} ${s.start}-${s.end}`);
        assert.ok(new Set(dm.plan.stages.map((s) => s.device)).size >= 2, `the plan spreads: ${real.join(', ')}`);
        const swarm = plannedSwarm(dm.plan)!;
        const all = layerCosts(model.layers);
        const blocks = all.slice(1, config.layers + 1);
        const links = measuredLinks(swarm.links);
        const simulated = placeTraining(records, blocks, user.peerId.toString(), links, () => {}, all[0].activationBytesPerToken);
        assert.deepEqual(simulated.plan.stages.map((s) => `${s.device} ${s.start}-${s.end}`), real);
        assert.equal(simulated.plan.bottleneckSeconds, dm.plan.bottleneckSeconds);
        const memory = new Map(records.map((r) => [r.peerId, r.capabilities!.memoryBytes / 2 ** 20]));
        const where = dm.plan.stages.map((s) => `blocks ${s.start}-${s.end - 1} on the ${memory.get(s.device)} MiB worker`);
        t.diagnostic(`both plans: ${where.join(', ')}`);
      } finally {
        await dm.close();
      }
    } finally {
      await user.stop();
    }
  });

  test('hosts joining one after another take the spans the simulation\'s hosts take; a user routes over them as the simulation does', async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'tl-small-hosted-'));
    const config = llamaConfig({ vocabSize: 64, hidden: 64, layers: 8, heads: 4, kvHeads: 2, intermediate: 128, maxPositions: 64 });
    await saveModel(createModel(config, { seed: 4 }), join(dir, 'eight'));
    const perBlock = partHeldBytes(config, [1, 2], null);
    // memory for 3, 2, 4, 1 and 3 blocks (spanLength: as many as fit BLOCK_MEMORY_SHARE of it)
    const memories = [3, 2, 4, 1, 3].map((blocks) => Math.ceil(((blocks + 0.5) * perBlock) / BLOCK_MEMORY_SHARE));
    const validator = await startNode(['validator', '--backend', 'js']);
    nodes.push(validator);
    const boot = validator.addrs[0];
    // a DHT client: no host finds this node in its routing table and dials it directly, past the host's relay
    const user = await createNode({ dhtClient: true });
    const relays: DelayRelay[] = [];
    try {
      const joined: string[] = [];
      for (const memory of memories) {
        // each host is reached through a delay relay of its own (its announced address), slowed once placed
        const relay = await startDelayRelay({ targetHost: '127.0.0.1', targetPort: 0, delayMs: 0 });
        relays.push(relay);
        const host = await startNode(['worker', '--bootstrap', boot, '--backend', 'js', '--models', dir, '--host-auto', '--rebalance', '0',
          '--memory', String(memory), '--announce', `/ip4/127.0.0.1/tcp/${relay.port}`]);
        nodes.push(host);
        relay.setTarget(ownPort(host, relay));
        joined.push(host.peerId);
        // the next joins once this one is in the index: each sees the spans of those before it, as in the simulation
        await waitFor(`host ${joined.length} in the index`, async () =>
          (await listModels(user, multiaddr(boot))).models[0]?.hosts.some((h) => h.peerId === host.peerId), 30_000);
      }
      const entry = (await listModels(user, multiaddr(boot))).models[0];
      const peers = await listWorkers(user, multiaddr(boot));
      const records = new Map(peers.map((r) => [r.peerId, r]));
      const real = joined.map((id) => entry.hosts.find((h) => h.peerId === id)!).map((h) => `${h.layers[0]}-${h.layers[1]}`);
      // the simulation's model: its blocks as heavy as these (its FLOPs per token are not these, but every host's
      // throughput is over the same blocks, so the comparisons placement makes come out the same)
      const model = { name: 'eight', hash: entry.hash, blocks: config.layers, blockParams: perBlock / 2, weight: 1 };
      const spans: Spans = [new Map()];
      const simulated = joined.map((id, i) => {
        const chosen = chooseSpan([model], spans, id, records.get(id)!.capabilities!.gflops, memories[i]);
        assert.ok(chosen, `the simulation's host ${i + 1} takes a span`);
        spans[0].set(id, chosen.span);
        return `${chosen.span.start}-${chosen.span.end - 1}`;
      });
      assert.deepEqual(simulated, real);
      assert.ok(new Set(real).size >= 3, `the hosts spread over the model: ${real.join(', ')}`);

      // routes: a sixth host (`--host`, not placing itself) holds the last hop of the route the router takes when every
      // round trip is alike once more, so that the route has another way. Every host but those of that route with its
      // last hop on the other copy is put 80 ms away; the user's router (pinging through the relays) takes the route the
      // simulation takes as the best with those round trips (routeOver over the true ones)
      const options = { tokens: 16, blockFlops: sectionCost(config, [1, 2]).flopsPerToken };
      const ones = (ids: readonly string[]) => new Map(ids.map((id) => [id, 1]));
      const before = routeOver(entry, peers, { ...options, rttMs: ones(joined) })!;
      const [first, last] = before.at(-1)!.layers;
      const relay = await startDelayRelay({ targetHost: '127.0.0.1', targetPort: 0, delayMs: 0 });
      relays.push(relay);
      const sixth = await startNode(['worker', '--bootstrap', boot, '--backend', 'js', '--host', `eight=${join(dir, 'eight')}:${first}-${last}`,
        '--announce', `/ip4/127.0.0.1/tcp/${relay.port}`]);
      nodes.push(sixth);
      relay.setTarget(ownPort(sixth, relay));
      joined.push(sixth.peerId);
      real.push(`${first}-${last}`);
      const { value: six } = await waitFor('the sixth host in the index', async () => {
        const m = (await listModels(user, multiaddr(boot))).models[0];
        return m?.hosts.length === 6 ? m : null;
      }, 30_000);
      const everyone = await listWorkers(user, multiaddr(boot));
      // the user reaches each host at its announced address only (a host's own listening ones are on this machine too)
      const announced = new Map(joined.map((id, i) => [id, `/ip4/127.0.0.1/tcp/${relays[i].port}/p2p/${id}`]));
      const hosts = everyone.filter((p) => announced.has(p.peerId)).map((p) => ({ ...p, addrs: [announced.get(p.peerId)!] }));
      const name = (id: string) => `${real[joined.indexOf(id)]} (host ${joined.indexOf(id) + 1})`;
      const alike = routeOver(six, everyone, { ...options, rttMs: ones(joined) })!;
      // the route the round trips are to make best: the alike one with its last hop on another host of those blocks; its
      // hosts stay on the loopback, every other host is put 80 ms away (each hop one near host: no tie for noise to break)
      const [a, b] = alike.at(-1)!.layers;
      const other = six.hosts.find((h) => h.state === 'online' && h.layers[0] === a && h.layers[1] === b && h.peerId !== alike.at(-1)!.peerId)!;
      assert.ok(other, `another host of blocks ${a}-${b}`);
      const target = [...alike.slice(0, -1).map((h) => h.peerId), other.peerId];
      const near = new Set(target);
      joined.forEach((id, i) => relays[i].setDelay(near.has(id) ? 0 : 40));
      const trueRtts = new Map(joined.map((id) => [id, near.has(id) ? 1 : 80]));
      const best = routeOver(six, everyone, { ...options, rttMs: trueRtts })!.map((h) => h.peerId);
      assert.deepEqual(best, target, 'the simulation\'s best route with those round trips');
      // a connection this node's DHT made to a host at start (its routing table's first fill) goes past the host's relay:
      // closed, so that every ping goes by the announced address (the table is refilled minutes from now)
      await Promise.all(joined.map((id) => user.hangUp(peerIdFromString(id))));
      const routed = (await measuredRoute(user, six, hosts, hosts, options, 20_000))!.map((h) => h.peerId);
      assert.deepEqual(routed.map(name), best.map(name));
      t.diagnostic(`both placed, in the order they joined: ${real.slice(0, 5).join(', ')}; a sixth host of ${first}-${last}; with round trips `
        + `alike the route is ${alike.map((h) => name(h.peerId)).join(' → ')}; the others 80 ms away, both route ${best.map(name).join(' → ')}`);
    } finally {
      await user.stop();
      await Promise.all(relays.map((r) => r.close()));
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
