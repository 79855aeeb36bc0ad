import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { fortunesDataset, heldOutLoss, textBatch } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer } from '../../src/models/index.ts';
import type { Traffic } from '../../src/p2p/index.ts';
import type { PipelineStage } from '../../src/pipeline/index.ts';
import { distribute, type DistributedTrainerOptions } from '../../src/user/index.ts';
import { inProcessSwarm } from '../helpers/in-process-swarm.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const config = gpt2Config({ vocabSize: 257, hidden: 64, layers: 2, heads: 4, maxPositions: 33 });
const SEQ = 32;
const data = fortunesDataset(tok);

const swarm = inProcessSwarm;

type Net = Awaited<ReturnType<typeof swarm>>;

interface Run {
  losses: number[];
  heldOut: number;
  /** Bytes per step by kind, over the steps after the first. */
  perStep: Traffic;
}

/** `steps` steps on real text (the same seeded model and batches every run), then the held-out loss. */
async function train(
  net: Net,
  steps: number,
  options: Partial<DistributedTrainerOptions>,
  replicas = 1,
  inspect?: (stages: PipelineStage[]) => Promise<void>,
): Promise<Run> {
  const dm = await distribute(net.user, net.boot, createModel(config, { seed: 3 }), {
    strategy: 'parameter-balanced', replicas, training: true, verify: { sampleRate: 0 },
  });
  try {
    const trainer = await dm.trainer({ optimizer: { lr: 3e-3 }, totalSteps: steps, warmupSteps: 2, microBatches: 2, replicas, ...options });
    const rng = new Generator(11);
    const losses = [(await trainer.step(textBatch(data.train, rng, 8, SEQ))).loss];
    const first = dm.traffic();
    for (let s = 1; s < steps; s++) losses.push((await trainer.step(textBatch(data.train, rng, 8, SEQ))).loss);
    const last = dm.traffic();
    const perStep = Object.fromEntries(
      Object.entries(last).map(([k, v]) => [k, (v - first[k as keyof Traffic]) / (steps - 1)]),
    ) as unknown as Traffic;
    await inspect?.(trainer.stages);
    const { loss } = await heldOutLoss((ids) => dm.logits(ids), data.heldOut, { seqLen: SEQ, batchSize: 16, windows: 64 });
    return { losses, heldOut: loss, perStep };
  } finally {
    await dm.close();
  }
}

describe('less traffic per step (real text: Debian\'s fortunes; js backend, workers on 127.0.0.1)', () => {
  setBackend('js');
  let net: Net;
  before(async () => {
    net = await swarm(4);
  });
  after(async () => {
    await net?.stop();
  });

  test('activations go worker to worker: the same losses bit for bit as relayed through the user, with 3 transfers a hop chain instead of 4', async () => {
    const relayed = await train(net, 4, { relay: true });
    const direct = await train(net, 4, {});
    assert.deepEqual(direct.losses, relayed.losses);
    assert.equal(direct.heldOut, relayed.heldOut);
    // two workers: user → A → B → user (3 transfers each way) against user → A → user → B → user (4)
    const ratio = direct.perStep.activations / relayed.perStep.activations;
    console.log(`activation bytes a step: relayed ${relayed.perStep.activations}, worker to worker ${direct.perStep.activations} (${ratio.toFixed(3)})`);
    assert.ok(Math.abs(ratio - 0.75) < 0.01, `ratio ${ratio}`);
  });

  // 30 steps of 2 replicas with their gradients summed exactly every step: the reference of the next two tests
  let exactRun: Promise<Run> | null = null;
  const exactReplicas = () => (exactRun ??= train(net, 30, {}, 2));

  test('replicas exchange DCT top-k gradients (k 32 per 64×64, 8-bit, error feedback): ≥ 100× fewer gradient bytes, held-out loss within 3% of exact', async () => {
    const steps = 30;
    const exact = await exactReplicas();
    const dct = await train(net, steps, { compressGrads: { k: 32, chunk: 64, bits: 8 } }, 2);
    const ratio = exact.perStep.gradients / dct.perStep.gradients;
    const gap = dct.heldOut / exact.heldOut - 1;
    console.log(`gradient bytes a step: ${exact.perStep.gradients} → ${dct.perStep.gradients} (${ratio.toFixed(1)}× fewer); held-out loss ${exact.heldOut.toFixed(4)} → ${dct.heldOut.toFixed(4)} (${(100 * gap).toFixed(2)}%)`);
    assert.ok(dct.losses.at(-1)! < dct.losses[0] - 0.5, 'compressed training converges');
    assert.ok(ratio >= 100, `${ratio}× fewer`);
    assert.ok(Math.abs(gap) < 0.03, `held-out loss ${(100 * gap).toFixed(2)}% from exact`);
  });

  test('replicas take 8 local steps, then average their weights\' changes DCT top-k compressed (k 256): ≥ 100× fewer bytes, held-out within 3%, replicas equal', async () => {
    const steps = 30;
    const exact = await exactReplicas();
    const same: boolean[] = [];
    const local = await train(net, steps, { syncEvery: 8, compressGrads: { k: 256, chunk: 64, bits: 8 } }, 2, async (stages) => {
      // the schedule's last step averages too: every section's replicas hold the same weights at the end
      for (const st of stages.filter((x) => x.replicas.length === 2)) {
        const [a, b] = await Promise.all(st.replicas.map((h) => h.weights()));
        same.push([...a].every(([n, t]) => t.data.every((v, i) => v === b.get(n)!.data[i])));
      }
    });
    const ratio = exact.perStep.gradients / local.perStep.gradients;
    const gap = local.heldOut / exact.heldOut - 1;
    console.log(`local steps ×8 + DCT top-k 256: bytes among replicas a step ${exact.perStep.gradients} → ${local.perStep.gradients.toFixed(0)} (${ratio.toFixed(1)}× fewer); held-out loss ${exact.heldOut.toFixed(4)} → ${local.heldOut.toFixed(4)} (${(100 * gap).toFixed(2)}%)`);
    assert.deepEqual(same, [true, true]);
    assert.ok(local.losses.at(-1)! < local.losses[0] - 0.5, 'training with local steps converges');
    assert.ok(ratio >= 100, `${ratio}× fewer`);
    assert.ok(Math.abs(gap) < 0.03, `held-out loss ${(100 * gap).toFixed(2)}% from exact`);
  });

  test('fp16 and int8 activations on every hop: 2× and ~4× fewer activation bytes, losses within 1% of float32', async () => {
    const steps = 10;
    const exact = await train(net, steps, {});
    for (const codec of ['fp16', 'int8'] as const) {
      const run = await train(net, steps, { compressActivations: codec });
      const ratio = exact.perStep.activations / run.perStep.activations;
      const worst = Math.max(...run.losses.map((l, i) => Math.abs(l / exact.losses[i] - 1)));
      console.log(`${codec}: activation bytes ${exact.perStep.activations} → ${run.perStep.activations} (${ratio.toFixed(2)}× fewer); worst step loss ${(100 * worst).toFixed(3)}% off; held-out ${exact.heldOut.toFixed(4)} → ${run.heldOut.toFixed(4)}`);
      assert.ok(ratio > (codec === 'fp16' ? 1.95 : 3.5), `${ratio}`);
      assert.ok(worst < 0.01, `a step's loss ${(100 * worst).toFixed(3)}% off`);
      assert.ok(Math.abs(run.heldOut / exact.heldOut - 1) < 0.01);
    }
  });
});
