// Issue #31: `--host-auto`. Six hosts of three blocks each, joining one after another, place themselves over a
// 12-block model (Petals' block selection) so that every block is served; a host killed leaves a hole that another
// host fills by moving, without uncovering any block.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { createModel, llamaConfig, saveModel } from '../../src/models/index.ts';
import { createNode, type HostedModelEntry } from '../../src/p2p/index.ts';
import { listModels } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { startWorker, type Worker } from '../../src/worker/index.ts';
import { waitFor } from '../helpers/processes.ts';

/** How many online hosts hold each block. */
function coverage(m: HostedModelEntry): number[] {
  const c = new Array<number>(m.layers).fill(0);
  for (const h of m.hosts) if (h.state === 'online') for (let b = h.layers[0]; b <= h.layers[1]; b++) c[b]++;
  return c;
}

describe('--host-auto', () => {
  test('six hosts cover a 12-block model; a killed host\'s hole is filled by another moving', { timeout: 120_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tl-host-auto-'));
    const models = join(dir, 'models');
    await saveModel(createModel(llamaConfig({ vocabSize: 64, hidden: 32, layers: 12, heads: 4, kvHeads: 2, intermediate: 64, maxPositions: 64 }), { seed: 2 }), join(models, 'twelve'));
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const user = await createNode();
    const hosts: Worker[] = [];
    try {
      for (let i = 0; i < 6; i++) {
        hosts.push(await startWorker({ bootstrap: boot, modelsDir: models, hostAuto: { blocks: 3, jitterMs: 0, rebalanceMs: 300 } }));
      }
      const index = async () => (await listModels(user, validator.node.getMultiaddrs()[0])).models[0];
      const first = await index();
      assert.equal(first.name, 'twelve');
      assert.equal(first.hosts.length, 6);
      assert.ok(first.complete, `every block served: ${coverage(first)}`);
      process.stderr.write(`six hosts placed: ${first.hosts.map((h) => `${h.layers[0]}-${h.layers[1]}`).sort().join(' ')}; coverage ${coverage(first)}\n`);
      // kill a host that alone holds some block (or, if none does, any): it stops without a word
      const c = coverage(first);
      const victim = first.hosts.find((h) => c.slice(h.layers[0], h.layers[1] + 1).some((n) => n === 1)) ?? first.hosts[0];
      const killed = hosts.find((h) => h.node.peerId.toString() === victim.peerId)!;
      await killed.node.stop();
      // the validator forgets it (its announcements stop), and the hole is filled by another host moving
      const { value: healed, ms } = await waitFor('every block served again', async () => {
        const m = await index();
        return m.hosts.length === 5 && m.complete ? m : null;
      }, 30_000);
      process.stderr.write(`killed the host of ${victim.layers[0]}-${victim.layers[1]}; ${ms} ms later: ${healed.hosts.map((h) => `${h.layers[0]}-${h.layers[1]}`).sort().join(' ')}; coverage ${coverage(healed)}\n`);
      assert.ok(coverage(healed).every((n) => n > 0));
    } finally {
      await user.stop();
      await Promise.all(hosts.map((h) => h.stop().catch(() => {})));
      await validator.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
