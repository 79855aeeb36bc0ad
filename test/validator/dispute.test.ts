import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { configToHF, createModel, gpt2Config } from '../../src/models/index.ts';
import { createLogger, createNode, request } from '../../src/p2p/index.ts';
import { sectionWeights } from '../../src/pipeline/index.ts';
import { Generator, randn, setBackend } from '../../src/tensor/index.ts';
import { RemoteStage, tensorSource } from '../../src/user/index.ts';
import { recordOf } from '../../src/user/remote-stage.ts';
import { startValidator } from '../../src/validator/index.ts';
import { parseRecord, type WorkRecord } from '../../src/verify/index.ts';
import { startWorker, type Worker } from '../../src/worker/index.ts';

const config = gpt2Config({ vocabSize: 64, hidden: 32, layers: 4, heads: 4, maxPositions: 16 });
const range: [number, number] = [1, 3];

describe('disputes by bisection over the network (js backend)', () => {
  setBackend('js');

  test('an honest worker against one that adds noise to its output: the validator bisects to the last op, re-runs it alone and names it; the cheater loses', async () => {
    const lines: string[] = [];
    const validator = await startValidator({ log: createLogger({ level: 'warn', write: (l) => lines.push(l) }) });
    const boot = validator.node.getMultiaddrs()[0].toString();
    const workers: Worker[] = [await startWorker({ bootstrap: boot }), await startWorker({ bootstrap: boot, fault: { kind: 'noise', rate: 1 } })];
    const user = await createNode();
    try {
      const model = createModel(config, { seed: 5 });
      const weights = sectionWeights(model, range);
      const x = randn([2, 8, 32], { generator: new Generator(1) });
      const g = randn([2, 8, 32], { generator: new Generator(2) });
      const jobId = 'job-dispute';
      // the same section and micro-batch on both workers, verification on (each keeps what a dispute needs)
      const records: WorkRecord[] = [];
      for (const w of workers) {
        const stage = await RemoteStage.open(user, w.node.getMultiaddrs()[0], jobId);
        await stage.load(configToHF(config), range, tensorSource(weights), { verifiers: [validator.node.peerId.toString()] });
        await stage.call({ type: 'train-setup', lr: 1e-3, peers: [], keepState: true }, []);
        records.push(parseRecord(recordOf(await stage.call({ type: 'train-forward', micro: 0 }, [x]))));
        // a step taken since: the disputed forward is the last step's, recomputed with the weights that step started from
        await stage.call({ type: 'train-backward', micro: 0 }, [g]);
        await stage.call({ type: 'step', scale: 1, lr: 1e-3 }, []);
      }
      assert.notEqual(records[0].output, records[1].output, 'the copies disagree');
      const side = (i: number) => {
        const { node } = workers[i];
        return { worker: { peerId: node.peerId.toString(), addrs: node.getMultiaddrs().map(String) }, record: records[i] };
      };
      // the honest worker's record, audited (re-executed) by the validator, then the same audit replayed: answered from
      // the first run, its reputation moved once
      const honest = workers[0].node.peerId.toString();
      const auditOf = { type: 'audit', jobId, config: configToHF(config), optimizer: { lr: 1e-3 }, ...side(0) };
      const first = await request(user, validator.node.getMultiaddrs()[0], auditOf);
      assert.equal(first.ok, true, String(first.reason));
      assert.equal(validator.reputation.standing(honest).passed, 1);
      const replayed = await request(user, validator.node.getMultiaddrs()[0], auditOf);
      assert.deepEqual(replayed, first, 'the replay gets the first verdict');
      assert.equal(validator.reputation.standing(honest).passed, 1, 'a replayed audit moves no reputation');
      const answer = await request(user, validator.node.getMultiaddrs()[0], { type: 'dispute', jobId, config: configToHF(config), a: side(0), b: side(1) });
      const cheater = workers[1].node.peerId.toString();
      assert.deepEqual(answer.losers, [cheater], String(answer.reason));
      const cost = answer.cost as { ops: number; opsRerun: number; compared: number; leaves: number; values: number; bytes: number };
      const op = answer.op as { index: number; name: string };
      // the noise is added after the section's last op: that op, re-run alone, is where the cheater's signed output parts from f(inputs)
      assert.equal(op.index, cost.ops - 1);
      assert.equal(cost.opsRerun, 1);
      const logged = lines.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.event === 'dispute-settled');
      assert.ok(logged, 'the validator logs the dispute');
      assert.equal(logged.op, `op ${op.index} '${op.name}'`);
      assert.deepEqual(logged.losers, [cheater]);
      // the cheater's reputation took a failed check naming the op; the honest worker's a passed one
      assert.equal(validator.reputation.standing(cheater).failed, 1);
      assert.equal(validator.reputation.standing(honest).failed, 0);
      // what re-executing the record instead would move: the section's weights and the input
      const reexecBytes = 4 * ([...weights.values()].reduce((n, t) => n + t.size, 0) + x.size);
      assert.ok(cost.bytes < reexecBytes, `${cost.bytes} bytes against ${reexecBytes}`);
      console.log(`dispute: op ${op.index} '${op.name}' of ${cost.ops}, ${cost.opsRerun} op re-run, ${cost.compared} slots compared, ${cost.leaves} leaves and ${cost.values} values fetched, ${cost.bytes} bytes received; re-executing the record: ${cost.ops} ops and ${reexecBytes} bytes`);
      // a worker that cannot answer for its values loses the dispute
      await workers[1].stop();
      const late = await request(user, validator.node.getMultiaddrs()[0], { type: 'dispute', jobId, config: configToHF(config), a: side(0), b: side(1) });
      assert.deepEqual(late.losers, [cheater]);
      assert.match(String(late.reason), /did not commit/);
      // disputed again, its records are the same evidence: each worker's reputation moved once
      assert.equal(validator.reputation.standing(cheater).failed, 1, 'a dispute asked again moves no reputation twice');
      assert.equal(validator.reputation.standing(honest).passed, 2, 'the audit and the first dispute');
    } finally {
      await user.stop();
      await Promise.all(workers.map((w) => w.stop().catch(() => {})));
      await validator.stop();
    }
  });
});
