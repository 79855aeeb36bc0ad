import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  fortuneQuotes, fortunesDataset, heldOutLoss, QUOTE_SEPARATOR, splitQuotes, type TextCodec, textBatch,
} from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer } from '../../src/models/index.ts';
import { parseForward, parseTraffic, type Traffic } from '../../src/p2p/index.ts';
import type { PipelineStage } from '../../src/pipeline/index.ts';
import { distribute, type DistributedTrainerOptions } from '../../src/user/index.ts';
import { inProcessSwarm } from '../helpers/in-process-swarm.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const config = gpt2Config({ vocabSize: 257, hidden: 64, layers: 2, heads: 4, maxPositions: 33 });
const SEQ = 32;
// The tokenizer is byte-level (token = UTF-8 byte): the corpus is encoded as its bytes, the same ids
// without the tokenizer's 5 s of pre-tokenising 2.5 MB (the first test checks them against it).
const bytes: TextCodec = { encode: (text) => Array.from(Buffer.from(text, 'utf8')) };
const data = fortunesDataset(bytes);

const swarm = inProcessSwarm;

type Net = Awaited<ReturnType<typeof swarm>>;

interface Run {
  losses: number[];
  heldOut: number;
  /** Bytes per step by kind, over the steps after the first. */
  perStep: Traffic;
}

/** `steps` steps of 4 windows of real text (the same seeded model and batches every run), then the held-out loss. */
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
    const losses = [(await trainer.step(textBatch(data.train, rng, 4, SEQ))).loss];
    const first = dm.traffic();
    for (let s = 1; s < steps; s++) losses.push((await trainer.step(textBatch(data.train, rng, 4, SEQ))).loss);
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

describe('a session\'s codec and the traffic kinds on the wire', () => {
  test('the byte-level tokenizer\'s ids are the text\'s UTF-8 bytes (the corpus is encoded so): the held-out quotes, id for id', () => {
    const { heldOut } = splitQuotes(fortuneQuotes());
    assert.deepEqual(data.heldOut, Int32Array.from(tok.encode(heldOut.join(QUOTE_SEPARATOR))));
  });

  test('a forward names fp16, int8 or no codec; any other is a typed error', () => {
    assert.equal(parseForward({ sessionId: 's' }).codec, null);
    assert.equal(parseForward({ sessionId: 's', codec: 'int8' }).codec, 'int8');
    assert.equal(parseForward({ sessionId: 's', codec: 'fp16' }).codec, 'fp16');
    for (const codec of ['none', 'bf16', 8, null]) assert.throws(() => parseForward({ sessionId: 's', codec }), { name: 'InvalidMessageError' });
  });

  test('a worker\'s traffic report: audits apart (none from a worker that does not count them), every count finite and ≥ 0', () => {
    const counts = { activations: 1, gradients: 2, weights: 3, control: 4 };
    assert.deepEqual(parseTraffic(counts), { ...counts, audits: 0 });
    assert.equal(parseTraffic({ ...counts, audits: 5 }).audits, 5);
    for (const audits of [-1, Infinity, '5']) assert.throws(() => parseTraffic({ ...counts, audits }), { name: 'InvalidMessageError' });
  });
});

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
    const relayed = await train(net, 2, { relay: true });
    const direct = await train(net, 2, {});
    assert.deepEqual(direct.losses, relayed.losses);
    assert.equal(direct.heldOut, relayed.heldOut);
    // two workers: user → A → B → user (3 transfers each way) against user → A → user → B → user (4)
    const ratio = direct.perStep.activations / relayed.perStep.activations;
    console.log(`activation bytes a step: relayed ${relayed.perStep.activations}, worker to worker ${direct.perStep.activations} (${ratio.toFixed(3)})`);
    assert.ok(Math.abs(ratio - 0.75) < 0.01, `ratio ${ratio}`);
  });

  // 20 steps of 2 replicas with their gradients summed exactly every step: the reference of the next two tests
  // (not a multiple of 8: the local steps' last window is a partial one, averaged at the schedule's end)
  const STEPS = 20;
  let exactRun: Promise<Run> | null = null;
  const exactReplicas = () => (exactRun ??= train(net, STEPS, {}, 2));

  test('replicas exchange DCT top-k gradients (k 32 per 64×64, 8-bit, error feedback): ≥ 100× fewer gradient bytes, held-out loss within 3% of exact', async () => {
    const exact = await exactReplicas();
    const dct = await train(net, STEPS, { compressGrads: { k: 32, chunk: 64, bits: 8 } }, 2);
    const ratio = exact.perStep.gradients / dct.perStep.gradients;
    const gap = dct.heldOut / exact.heldOut - 1;
    console.log(`gradient bytes a step: ${exact.perStep.gradients} → ${dct.perStep.gradients} (${ratio.toFixed(1)}× fewer); held-out loss ${exact.heldOut.toFixed(4)} → ${dct.heldOut.toFixed(4)} (${(100 * gap).toFixed(2)}%)`);
    assert.ok(dct.losses.at(-1)! < dct.losses[0] - 0.5, 'compressed training converges');
    assert.ok(ratio >= 100, `${ratio}× fewer`);
    assert.ok(Math.abs(gap) < 0.03, `held-out loss ${(100 * gap).toFixed(2)}% from exact`);
  });

  test('replicas take 8 local steps, then average their weights\' changes DCT top-k compressed (k 256): ≥ 100× fewer bytes, held-out within 3%, replicas equal', async () => {
    const exact = await exactReplicas();
    const same: boolean[] = [];
    const local = await train(net, STEPS, { syncEvery: 8, compressGrads: { k: 256, chunk: 64, bits: 8 } }, 2, async (stages) => {
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

  test('fp16 and int8 on every hop of 2 sections × 2 replicas, the evaluation\'s included: 2× and ≥ 3.5× fewer activation bytes, losses within 1% of float32, every sampled record checked', async () => {
    const exact = await trainAndEvaluate(net, null);
    for (const codec of ['fp16', 'int8'] as const) {
      const run = await trainAndEvaluate(net, codec);
      const ratio = exact.traffic.activations / run.traffic.activations;
      const worst = Math.max(...run.losses.map((l, i) => Math.abs(l / exact.losses[i] - 1)));
      console.log(`${codec}: activation bytes ${exact.traffic.activations} → ${run.traffic.activations} (${ratio.toFixed(2)}× fewer; the user's evaluation ${exact.evaluation} → ${run.evaluation}); worst step loss ${(100 * worst).toFixed(3)}% off; held-out ${exact.heldOut.toFixed(4)} → ${run.heldOut.toFixed(4)}; ${run.checked} records re-run, audits ${run.traffic.audits} B`);
      assert.ok(ratio > (codec === 'fp16' ? 1.95 : 3.5), `${ratio}`);
      assert.ok(worst < 0.01, `a step's loss ${(100 * worst).toFixed(3)}% off`);
      assert.ok(Math.abs(run.heldOut / exact.heldOut - 1) < 0.01);
      // the evaluation's hops are compressed too, not only the training's
      assert.ok(exact.evaluation / run.evaluation > (codec === 'fp16' ? 1.9 : 3.5), `evaluation ${exact.evaluation} → ${run.evaluation}`);
      // sampled records, the evaluation's decoding steps among them, re-run by the validator: none failed
      assert.ok(run.checked > 0 && run.failed === 0, `${run.checked} checked, ${run.failed} failed`);
    }
  });
});

interface Evaluated {
  losses: number[];
  heldOut: number;
  /** Bytes of the whole job by kind: its steps and its evaluation. */
  traffic: Traffic;
  /** Activation bytes the user sent for the evaluation. */
  evaluation: number;
  checked: number;
  failed: number;
}

/**
 * As `train --local 4 --replicas 2 --micro-batches 4 --compress-activations CODEC` does: 2 sections
 * × 2 replicas, a step, a held-out evaluation through the workers, and a step after it (workers
 * report what they sent at each step); a quarter of the records re-run by the validator.
 */
async function trainAndEvaluate(net: Net, codec: 'fp16' | 'int8' | null): Promise<Evaluated> {
  const dm = await distribute(net.user, net.boot, createModel(config, { seed: 3 }), {
    strategy: 'parameter-balanced', replicas: 2, training: true, verify: { sampleRate: 0.25 },
  });
  try {
    const compression = codec ? { compressActivations: codec } : {};
    const trainer = await dm.trainer({
      optimizer: { lr: 3e-3 }, totalSteps: 2, warmupSteps: 1, microBatches: 4, replicas: 2, ...compression,
    });
    const rng = new Generator(11);
    const losses: number[] = [];
    const start = dm.traffic();
    losses.push((await trainer.step(textBatch(data.train, rng, 8, SEQ))).loss);
    const before = dm.traffic().activations;
    const { loss: heldOut } = await heldOutLoss((ids) => dm.logits(ids), data.heldOut, { seqLen: SEQ, batchSize: 16, windows: 64 });
    const evaluation = dm.traffic().activations - before;
    losses.push((await trainer.step(textBatch(data.train, rng, 8, SEQ))).loss);
    const end = dm.traffic();
    const traffic = Object.fromEntries(Object.entries(end).map(([k, v]) => [k, v - start[k as keyof Traffic]])) as unknown as Traffic;
    const summary = await dm.settle();
    return { losses, heldOut, traffic, evaluation, checked: summary?.checked ?? 0, failed: summary?.failed ?? 0 };
  } finally {
    await dm.close();
  }
}
