// Issue #50's small-scale check: the simulation against real processes. Six worker processes (each offering the memory
// it is told) and a validator; a user plans a training job over them with distribute, and the simulation's placement
// (src/sim/training.ts) is handed what that user saw (the registry's records, the links it measured): it makes the same
// plan, worker for worker and layer for layer. The simulation's jobs are placed by this same code at 10,000 peers.
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { multiaddr } from '@multiformats/multiaddr';
import { createModel, gpt2Config } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { layerCosts, measuredLinks } from '../../src/plan/index.ts';
import { placeTraining } from '../../src/sim/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { distribute, listWorkers, plannedSwarm } from '../../src/user/index.ts';
import { type Running, startNode, waitFor } from '../helpers/processes.ts';

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
});
