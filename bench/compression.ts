import { localSwarm } from '../src/swarm/index.ts';
import { fortunesDataset, heldOutLoss, textBatch } from '../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer } from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import type { Traffic } from '../src/p2p/vocabulary.ts';
import { Generator, setBackend } from '../src/tensor/index.ts';
import type { DctTopkOptions } from '../src/compress/index.ts';
import { distribute } from '../src/user/index.ts';
import type { Row } from './gemm.ts';

const BATCH = 16;
const SEQ = 64;
const MICRO = 4;
const LR = 1e-3;
/** Held-out windows scored after training (the same ones for every configuration). */
const EVAL_WINDOWS = 128;
const config = gpt2Config({ vocabSize: 257, hidden: 128, layers: 4, heads: 4, maxPositions: SEQ + 1 });

const log = (s: string) => process.stderr.write(`${s}\n`);
const kb = (bytes: number) => bytes / 1000;
const times = (ref: number, v: number) => (v === 0 ? '∞' : ref / v >= 10 ? (ref / v).toFixed(0) : (ref / v).toFixed(2));

interface Setting {
  name: string;
  compressActivations?: 'fp16' | 'int8';
  compressGrads?: DctTopkOptions;
  /** Local steps between the replicas' averages (absent: gradients summed every step). */
  syncEvery?: number;
  relay?: boolean;
}

interface Outcome {
  setting: Setting;
  /** Bytes per step over the measured steps. */
  activations: number;
  gradients: number;
  loss: number;
  perplexity: number;
  tokensPerSecond: number;
  /** Held-out loss of the untrained model (measured once, on the first configuration). */
  initialLoss?: number;
}

type Swarm = Awaited<ReturnType<typeof localSwarm>>;
type Data = ReturnType<typeof fortunesDataset>;

interface RunOptions {
  steps: number;
  replicas: number;
  evaluate: boolean;
  /** Score the untrained model too. */
  initial?: boolean;
}

/** Trains `steps` steps of one configuration on a fresh copy of the same model with the same batches; bytes and tokens/s over them. */
async function train(swarm: Swarm, data: Data, s: Setting, o: RunOptions): Promise<Outcome> {
  const user = await createNode();
  try {
    const dm = await distribute(user, swarm.bootstrap, createModel(config, { seed: 7 }), {
      strategy: 'parameter-balanced', replicas: o.replicas, training: true, verify: { sampleRate: 0 },
    });
    try {
      const sections = new Set(dm.assignment.map((a) => `${a.start}-${a.end}`)).size;
      log(`  ${s.name}: ${sections} section(s) × ${o.replicas} replica(s) on ${dm.assignment.length} workers`);
      const evaluate = async () => {
        const heldOut = data.heldOut.length > SEQ + 2 ? data.heldOut : data.train;
        return heldOutLoss(async (ids) => dm.logits(ids), heldOut, { seqLen: SEQ, batchSize: BATCH, windows: EVAL_WINDOWS });
      };
      const initialLoss = o.initial ? (await evaluate()).loss : undefined;
      const trainer = await dm.trainer({
        optimizer: { lr: LR }, totalSteps: o.steps, microBatches: MICRO, schedule: '1f1b', replicas: o.replicas,
        ...(s.relay ? { relay: true } : {}),
        ...(s.compressActivations ? { compressActivations: s.compressActivations } : {}),
        ...(s.compressGrads ? { compressGrads: s.compressGrads } : {}),
        ...(s.syncEvery ? { syncEvery: s.syncEvery } : {}),
      });
      const rng = new Generator(11);
      const before: Traffic = { ...dm.traffic() };
      let seconds = 0;
      let last = 0;
      for (let i = 0; i < o.steps; i++) {
        const r = await trainer.step(textBatch(data.train, rng, BATCH, SEQ));
        // the first step warms the sessions up: tokens/s over the rest
        if (i > 0) seconds += r.seconds;
        last = r.loss;
        if ((i + 1) % 20 === 0 || i + 1 === o.steps) log(`    step ${i + 1}/${o.steps}: train loss ${r.loss.toFixed(3)}`);
      }
      const after = dm.traffic();
      const ev = o.evaluate ? await evaluate() : { loss: last, perplexity: Math.exp(last) };
      return {
        setting: s,
        activations: (after.activations - before.activations) / o.steps,
        gradients: (after.gradients - before.gradients) / o.steps,
        loss: ev.loss,
        perplexity: ev.perplexity,
        tokensPerSecond: (BATCH * SEQ * Math.max(1, o.steps - 1)) / Math.max(seconds, 1e-9),
        ...(initialLoss !== undefined ? { initialLoss } : {}),
      };
    } finally {
      await dm.close();
    }
  } finally {
    await user.stop();
  }
}

const SETTINGS: Setting[] = [
  { name: 'none (float32, worker to worker)' },
  { name: 'fp16 activations', compressActivations: 'fp16' },
  { name: 'int8 activations', compressActivations: 'int8' },
  { name: 'DCT top-k k=32 gradients', compressGrads: { k: 32, chunk: 64, bits: 8 } },
  { name: 'DCT top-k k=128 gradients', compressGrads: { k: 128, chunk: 64, bits: 8 } },
  { name: 'local steps ×8 (float32 averages)', syncEvery: 8 },
  { name: 'local steps ×8 + DCT top-k k=256', syncEvery: 8, compressGrads: { k: 256, chunk: 64, bits: 8 } },
  { name: 'int8 activations + local steps ×8 + DCT top-k k=256', compressActivations: 'int8', syncEvery: 8, compressGrads: { k: 256, chunk: 64, bits: 8 } },
];

function rowsOf(outcomes: Outcome[], steps: number): Row[] {
  const base = outcomes[0];
  const rows: Row[] = [];
  const model = `GPT-2 4×128, fortunes, ${steps} steps, 2 replicas`;
  for (const r of outcomes) {
    const s = r.setting;
    const rel = (100 * (r.loss - base.loss)) / base.loss;
    const gradTarget = s.compressGrads || s.syncEvery
      ? `≥100× fewer, loss within 3%: ${base.gradients / r.gradients >= 100 && Math.abs(rel) <= 3 ? 'met' : 'NOT met'}`
      : undefined;
    // int8 sends 1 byte an element plus a float32 scale a row: 4 × 128 / 132 = 3.88× at most here
    const actTarget = s.compressActivations === 'int8'
      ? `≥3.5× fewer, loss within 1%: ${base.activations / r.activations >= 3.5 && Math.abs(rel) <= 1 ? 'met' : 'NOT met'}`
      : undefined;
    rows.push(
      {
        section: 'compression', case: `${s.name}: activation bytes/step (${times(base.activations, r.activations)}× fewer), ${model}`,
        value: kb(r.activations), unit: 'kB/step', reference: 'none', referenceValue: kb(base.activations), ratio: r.activations / base.activations,
        ...(actTarget ? { target: actTarget } : {}),
      },
      {
        section: 'compression', case: `${s.name}: gradient bytes/step among replicas (${times(base.gradients, r.gradients)}× fewer)`,
        value: kb(r.gradients), unit: 'kB/step', reference: 'none', referenceValue: kb(base.gradients), ratio: r.gradients / base.gradients,
        ...(gradTarget ? { target: gradTarget } : {}),
      },
      {
        section: 'compression', case: `${s.name}: held-out loss (perplexity ${r.perplexity.toFixed(2)}, ${rel >= 0 ? '+' : ''}${rel.toFixed(2)}%)`,
        value: r.loss, unit: 'nats', reference: 'none', referenceValue: base.loss, ratio: r.loss / base.loss,
        ...(gradTarget ? { target: `within 3%: ${Math.abs(rel) <= 3 ? 'met' : 'NOT met'}` } : {}),
        ...(actTarget ? { target: `within 1%: ${Math.abs(rel) <= 1 ? 'met' : 'NOT met'}` } : {}),
      },
      {
        section: 'compression', case: `${s.name}: training speed`,
        value: r.tokensPerSecond, unit: 'tok/s', reference: 'none', referenceValue: base.tokensPerSecond, ratio: r.tokensPerSecond / base.tokensPerSecond,
      },
    );
  }
  return rows;
}

function summary(outcomes: Outcome[]): void {
  const base = outcomes[0];
  const head = ['configuration', 'act kB/step', 'act ×fewer', 'grad kB/step', 'grad ×fewer', 'held-out loss', 'ppl', 'Δloss', 'tok/s'];
  const body = outcomes.map((r) => [
    r.setting.name,
    kb(r.activations).toFixed(1), times(base.activations, r.activations),
    kb(r.gradients).toFixed(1), times(base.gradients, r.gradients),
    r.loss.toFixed(4), r.perplexity.toFixed(2), `${(r.loss >= base.loss ? '+' : '') + ((100 * (r.loss - base.loss)) / base.loss).toFixed(2)}%`,
    r.tokensPerSecond.toFixed(0),
  ]);
  const width = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i].length)));
  const line = (cells: string[]) => `  ${cells.map((c, i) => c.padEnd(width[i])).join(' | ')}`;
  log(line(head));
  for (const b of body) log(line(b));
}

/**
 * Compression of what a training job moves, on real text (Debian's fortunes, byte-level): the
 * same model, batches, lr and steps under each codec, 4 workers as 2 sections × 2 replicas.
 * Bytes per step by kind (what every side reported sending), held-out loss after the steps and
 * tokens/s, each against float32 worker to worker. Then relay (worker → user → worker) against
 * worker to worker, uncompressed, on 3 workers and 1 replica.
 */
export async function benchCompression(quick: boolean): Promise<Row[]> {
  const steps = quick ? 60 : 150;
  const codec = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  const data = fortunesDataset(codec);
  log(`  corpus: fortunes, ${data.train.length} training and ${data.heldOut.length} held-out tokens (bytes)`);
  setBackend('ort', { threads: 1, spinning: false });
  const rows: Row[] = [];
  const outcomes: Outcome[] = [];
  const t0 = performance.now();
  const swarm = await localSwarm({ workers: 4, threads: 1, handleSignals: false });
  try {
    for (const [i, s] of SETTINGS.entries()) {
      outcomes.push(await train(swarm, data, s, { steps, replicas: 2, evaluate: true, initial: i === 0 }));
    }
  } finally {
    await swarm.close();
  }
  rows.push(...rowsOf(outcomes, steps));
  const base = outcomes[0];
  log(`  ${steps} steps of ${BATCH}×${SEQ} tokens, ${MICRO} micro-batches, lr ${LR}, ${((performance.now() - t0) / 1000).toFixed(0)} s;`
    + ` held-out loss untrained ${base.initialLoss?.toFixed(4)} nats`);
  summary(outcomes);
  const best = outcomes.filter((r) => (r.setting.compressGrads || r.setting.syncEvery) && !r.setting.compressActivations);
  for (const r of best) {
    const rel = (100 * (r.loss - base.loss)) / base.loss;
    const x = base.gradients / r.gradients;
    log(`  target ≥100× fewer gradient bytes with held-out loss within 3%: ${r.setting.name}: ${x.toFixed(0)}× fewer, ${rel.toFixed(2)}%`
      + ` → ${x >= 100 && Math.abs(rel) <= 3 ? 'met' : 'NOT met'}`);
  }
  const int8 = outcomes.find((r) => r.setting.compressActivations === 'int8' && !r.setting.compressGrads)!;
  const rel8 = (100 * (int8.loss - base.loss)) / base.loss;
  const x8 = base.activations / int8.activations;
  log(`  target int8 activations ≥3.5× fewer activation bytes with held-out loss within 1%: ${x8.toFixed(2)}× fewer, ${rel8.toFixed(2)}%`
    + ` → ${x8 >= 3.5 && Math.abs(rel8) <= 1 ? 'met' : 'NOT met'}`);

  rows.push(...(await relayVsDirect(data)));
  return rows;
}

/** Relay (worker → user → worker) against worker to worker, uncompressed: 3 workers, 1 replica, a few steps each. */
export async function relayVsDirect(data: Data): Promise<Row[]> {
  log('  relay (worker → user → worker) vs worker to worker, 3 workers, 1 replica ...');
  const relaySteps = 10;
  const swarm = await localSwarm({ workers: 3, threads: 1, handleSignals: false });
  let direct: Outcome;
  let relayed: Outcome;
  try {
    direct = await train(swarm, data, { name: 'worker to worker' }, { steps: relaySteps, replicas: 1, evaluate: false });
    relayed = await train(swarm, data, { name: 'relayed by the user', relay: true }, { steps: relaySteps, replicas: 1, evaluate: false });
  } finally {
    await swarm.close();
  }
  const hop = 4 * (BATCH / MICRO) * SEQ * config.hidden;
  const label = `${relaySteps} steps, 3 workers, m = ${MICRO}`;
  const transfers = (direct.activations / hop / MICRO).toFixed(1);
  log(`  activation bytes/step: direct ${kb(direct.activations).toFixed(1)} kB (${(direct.activations / hop / MICRO).toFixed(1)} transfers/micro-batch),`
    + ` relay ${kb(relayed.activations).toFixed(1)} kB (${(relayed.activations / hop / MICRO).toFixed(1)} transfers/micro-batch);`
    + ` tok/s direct ${direct.tokensPerSecond.toFixed(0)}, relay ${relayed.tokensPerSecond.toFixed(0)}`);
  return [
    {
      section: 'compression', case: `worker to worker: activation bytes/step (${transfers} float32 transfers per micro-batch, forward and backward), ${label}`,
      value: kb(direct.activations), unit: 'kB/step', reference: 'relayed by the user', referenceValue: kb(relayed.activations),
      ratio: direct.activations / relayed.activations,
    },
    {
      section: 'compression', case: `worker to worker: training speed, ${label}`,
      value: direct.tokensPerSecond, unit: 'tok/s', reference: 'relayed by the user', referenceValue: relayed.tokensPerSecond,
      ratio: direct.tokensPerSecond / relayed.tokensPerSecond,
    },
  ];
}
