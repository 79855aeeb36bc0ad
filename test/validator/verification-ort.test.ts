import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { additionTask, taskBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { Generator, ortAvailable, setBackend } from '../../src/tensor/index.ts';
import { distribute } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { startWorker, type Worker } from '../../src/worker/index.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const config = gpt2Config({ vocabSize: 257, hidden: 64, layers: 4, heads: 4, maxPositions: 32 });

describe('proof of learning on onnxruntime: compared within the calibrated tolerance', { skip: ortAvailable() ? false : 'onnxruntime does not load on this machine' }, () => {
  test('noise of 1e-3 relative is caught at its first occurrence on ort; honest workers, compared and re-run throughout, are never flagged', async () => {
    setBackend('ort', { threads: 1 });
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const workers: Worker[] = [];
    try {
      for (let i = 0; i < 4; i++) workers.push(await startWorker({ bootstrap: boot, ...(i === 3 ? { fault: { kind: 'noise' as const, rate: 1 } } : {}) }));
      const cheater = workers[3].node.peerId.toString();
      const user = await createNode();
      try {
        // every record re-run as well: honest ort results must pass the validator's tolerance every time
        const dm = await distribute(user, boot, createModel(config, { seed: 5 }), { strategy: 'parameter-balanced', verify: { redundancy: 2, sampleRate: 1 } });
        assert.ok(dm.assignment.some((a) => a.peerId === cheater));
        const trainer = await dm.trainer({ optimizer: { lr: 3e-3 }, totalSteps: 4, microBatches: 4 });
        const task = additionTask({ seed: 2 });
        const rng = new Generator(7);
        const first = await trainer.step(taskBatch(task, tok, rng, 8, 256));
        assert.deepEqual(first.verification.flagged, [cheater]);
        for (let s = 1; s < 4; s++) await trainer.step(taskBatch(task, tok, rng, 8, 256));
        const v = dm.verification!;
        assert.deepEqual(v.flagged, [cheater], 'no honest worker flagged');
        assert.ok(v.checked > 30, `${v.checked} records re-run`);
        assert.ok(Number.isFinite(first.loss));
        await dm.close();
      } finally {
        await user.stop();
      }
    } finally {
      await Promise.all(workers.map((w) => w.stop()));
      await validator.stop();
      setBackend('js');
    }
  });
});
