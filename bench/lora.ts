import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createModel, llamaConfig, saveModel } from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { Generator, setBackend, tensor } from '../src/tensor/index.ts';
import { distribute } from '../src/user/index.ts';
import { startValidator } from '../src/validator/index.ts';
import { startWorker, type Worker } from '../src/worker/index.ts';
import type { JobMemory } from '../src/worker/memory.ts';
import type { Row } from './gemm.ts';

const log = (s: string) => process.stderr.write(`  lora: ${s}\n`);
const USES = ['weights', 'gradients', 'optimizer', 'activations', 'snapshot'] as const;

/** The most a job held on a worker of each kind while `run` ran (its accounting polled every few ms), and its sum. */
async function peakMemory(worker: Worker, jobId: () => string | null, run: () => Promise<void>): Promise<Record<(typeof USES)[number] | 'total', number>> {
  const peak = { weights: 0, gradients: 0, optimizer: 0, activations: 0, snapshot: 0, total: 0 };
  const sample = () => {
    const id = jobId();
    const j: JobMemory | undefined = worker.memory.report().jobs.find((x) => x.jobId === id);
    if (!j) return;
    for (const u of USES) peak[u] = Math.max(peak[u], j[u]);
    peak.total = Math.max(peak.total, USES.reduce((s, u) => s + j[u], 0));
  };
  const timer = setInterval(sample, 2);
  try {
    await run();
  } finally {
    clearInterval(timer);
  }
  sample();
  return peak;
}

/**
 * What a worker accounts for a LoRA job (rank 8 on the seven projections) over its section, against full training of the
 * same section: a Llama of 8 blocks × 512 split over 2 workers, one training step of 4 micro-batches of [2, 128]. Full
 * training holds the section at float32 with its gradients and AdamW's two moments; LoRA holds the frozen base (float32,
 * or int4: QLoRA) and only the factors' gradients and moments. The activations a micro-batch keeps for its backward are
 * alike in both. Verification off (on, each job also keeps the state a step starts from: 4× what it trains).
 */
export async function benchLora(): Promise<Row[]> {
  setBackend('ort');
  const dir = mkdtempSync(join(tmpdir(), 'tl-bench-lora-'));
  const config = llamaConfig({ vocabSize: 256, hidden: 512, layers: 8, heads: 8, kvHeads: 4, intermediate: 1376, maxPositions: 256 });
  await saveModel(createModel(config, { seed: 1 }), join(dir, 'model'));
  const validator = await startValidator();
  const boot = validator.node.getMultiaddrs()[0].toString();
  const workers = [await startWorker({ bootstrap: boot }), await startWorker({ bootstrap: boot })];
  const node = await createNode();
  const rows: Row[] = [];
  const rng = new Generator(1);
  const ids = Array.from({ length: 8 * 129 }, () => Math.floor(rng.uniform() * 256));
  const batch = { input: tensor(ids.filter((_, i) => i % 129 < 128), [8, 128], 'int32'), target: tensor(ids.filter((_, i) => i % 129 > 0), [8, 128], 'int32') };
  const lora = { r: 8, alpha: 16, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] };
  const jobs = [
    { name: 'full training, float32', options: {} },
    { name: 'LoRA r 8, float32 base', options: { adapter: { ...lora, seed: 1 } } },
    { name: 'LoRA r 8, int4 base (QLoRA)', options: { adapter: { ...lora, seed: 1 }, quantize: 'int4' as const } },
  ];
  try {
    let full: { total: number; state: number } | null = null;
    for (const job of jobs) {
      const dm = await distribute(node, boot, join(dir, 'model'), {
        strategy: 'parameter-balanced', training: true, verify: { sampleRate: 0 }, ...job.options,
      });
      try {
        const trainer = await dm.trainer({ optimizer: { lr: 1e-3 }, totalSteps: 2, microBatches: 4, schedule: '1f1b' });
        const first = workers.find((w) => w.node.peerId.toString() === dm.assignment[0].peerId)!;
        const peak = await peakMemory(first, () => dm.jobId, async () => {
          await trainer.step(batch);
        });
        const a = dm.assignment[0];
        const mib = (b: number) => `${(b / 2 ** 20).toFixed(2)} MiB`;
        log(`${job.name}: layers ${a.start}-${a.end - 1} on a worker: ${USES.map((u) => `${u} ${mib(peak[u])}`).join(', ')}; total ${mib(peak.total)}`);
        // what the job keeps between steps (weights, gradients, moments), and at its peak with the activations on top
        const state = peak.weights + peak.gradients + peak.optimizer + peak.snapshot;
        full ??= { total: peak.total, state };
        const reference = 'full training of the section, float32';
        const layers = `layers ${a.start}-${a.end - 1}`;
        rows.push({
          section: 'lora', case: `${job.name}: weights, gradients and moments on a worker (${layers})`, value: state / 2 ** 20,
          unit: 'MiB', reference, referenceValue: full.state / 2 ** 20, ratio: state / full.state,
        });
        rows.push({
          section: 'lora', case: `${job.name}: with the activations of 4 micro-batches of [2, 128] (${layers})`, value: peak.total / 2 ** 20,
          unit: 'MiB', reference, referenceValue: full.total / 2 ** 20, ratio: peak.total / full.total,
        });
      } finally {
        await dm.close();
      }
    }
  } finally {
    await node.stop();
    await Promise.all(workers.map((w) => w.stop()));
    await validator.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  return rows;
}
