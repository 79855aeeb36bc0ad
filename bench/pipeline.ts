import { createModel, gpt2Config, LocalTrainer, type TrainingBatch } from '../src/models/index.ts';
import { localSwarm } from '../src/swarm/index.ts';
import { distribute } from '../src/user/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { bubbleFraction } from '../src/pipeline/index.ts';
import { Generator, setBackend, tensor } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';

const BATCH = 16;
const SEQ = 64;
const VOCAB = 4096;

function batchOf(rng: Generator): TrainingBatch {
  const ids = Int32Array.from({ length: BATCH * (SEQ + 1) }, () => rng.int(VOCAB));
  const input = new Int32Array(BATCH * SEQ);
  const target = new Int32Array(BATCH * SEQ);
  for (let b = 0; b < BATCH; b++) {
    input.set(ids.subarray(b * (SEQ + 1), b * (SEQ + 1) + SEQ), b * SEQ);
    target.set(ids.subarray(b * (SEQ + 1) + 1, (b + 1) * (SEQ + 1)), b * SEQ);
  }
  return { input: tensor(input, [BATCH, SEQ], 'int32'), target: tensor(target, [BATCH, SEQ], 'int32') };
}

/**
 * Pipeline training across 1, 2 and 3 worker stages (each worker its own process on
 * loopback, one onnxruntime thread each) at 1, 4 and 8 micro-batches, against training in
 * one process (onnxruntime, every core) in the same run: tokens per second, and the bubble
 * measured from each worker's busy time against the schedule's (p − 1)/(m + p − 1).
 */
export async function benchPipeline(steps: number): Promise<Row[]> {
  const config = gpt2Config({ vocabSize: VOCAB, hidden: 256, layers: 6, heads: 8, maxPositions: SEQ });
  const tokens = BATCH * SEQ;
  setBackend('ort');
  const rng = new Generator(1);
  const local = new LocalTrainer(createModel(config, { seed: 0 }), { lr: 1e-4, totalSteps: 1000 });
  local.step(batchOf(rng));
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) local.step(batchOf(rng));
  const localRate = (tokens * steps) / ((performance.now() - t0) / 1000);
  setBackend('ort', { threads: 1, spinning: false });
  const rows: Row[] = [];
  for (const stages of [1, 2, 3]) {
    const swarm = await localSwarm({ workers: stages, threads: 1, handleSignals: false });
    const user = await createNode();
    try {
      for (const m of [1, 4, 8]) {
        const dm = await distribute(user, swarm.bootstrap, createModel(config, { seed: 0 }), { strategy: 'parameter-balanced' });
        try {
          const trainer = await dm.trainer({ optimizer: { lr: 1e-4 }, totalSteps: 1000, microBatches: m, schedule: '1f1b' });
          await trainer.step(batchOf(rng));
          let seconds = 0;
          let idle = 0;
          for (let i = 0; i < steps; i++) {
            const r = await trainer.step(batchOf(rng));
            seconds += r.seconds;
            // the workers' stages (not the user's ends): busy from the user's side, compute and transfer
            const workerBusy = r.busy.slice(1, -1).map((b) => b[0]);
            const span = r.seconds;
            idle += 1 - workerBusy.reduce((a, b) => a + b, 0) / (workerBusy.length * span);
          }
          const rate = (tokens * steps) / seconds;
          const label = `${stages} stage${stages > 1 ? 's' : ''}, m = ${m}, 1F1B`;
          rows.push(
            {
              section: 'pipeline',
              case: `train GPT-2 (256 wide, 6 blocks, ${tokens} tokens/step), ${label}`,
              value: rate,
              unit: 'tok/s',
              reference: 'one process',
              referenceValue: localRate,
              ratio: rate / localRate,
            },
            {
              section: 'pipeline',
              case: `bubble measured, ${label}`,
              value: 100 * (idle / steps),
              unit: '%',
              reference: '(p−1)/(m+p−1)',
              referenceValue: 100 * bubbleFraction(stages, m),
              // one stage has no bubble by the formula: its idle time is the user's ends and the flush
              ratio: stages === 1 ? Number.NaN : idle / steps / bubbleFraction(stages, m),
            },
          );
        } finally {
          await dm.close();
        }
      }
    } finally {
      await user.stop();
      await swarm.close();
    }
  }
  return rows;
}
