import { readFileSync } from 'node:fs';
import { textBatch } from '../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer, type TrainingBatch } from '../src/models/index.ts';
import { createNode, encodeControl, encodeTensor, toWire } from '../src/p2p/index.ts';
import { Generator, setBackend, tensor } from '../src/tensor/index.ts';
import { distribute, type DistributedJob, type JobTrainer, RedundantStage } from '../src/user/index.ts';
import { launchNode } from '../src/swarm/index.ts';
import type { RecordKind, WorkRecord } from '../src/verify/index.ts';
import { startWorker, type Worker } from '../src/worker/index.ts';
import type { Row } from './gemm.ts';

const ROWS = 8;
const SEQ = 64;
const MICRO = 4;
const HIDDEN = 256;
const LAYERS = 4;
const RATES = [0, 0.01, 0.05, 0.1] as const;
const SEED = 11;
const WARMUP = 2;
/** The overhead the feature promises at its default rate. */
const TARGET_RATE = 0.05;
const TARGET_PERCENT = 10;

/** One job of the run: how it checks its workers, and what it measured. */
interface Job {
  label: string;
  sampleRate: number;
  redundancy: number;
  dm: DistributedJob;
  trainer: JobTrainer;
  /** Wall seconds of each measured step (the step and the audits after it). */
  wall: number[];
  /** The pipeline's own seconds of each measured step (without the audits). */
  pipeline: number[];
  losses: number[];
  /** Records the user received and checked (every worker computation), during measured steps. */
  records: number;
  /** Records re-executed by the validator before the measured steps began (warm-up). */
  checkedBefore: number;
  /** Milliseconds of each audit (request to verdict, seen by the user), by record kind. */
  audits: Map<RecordKind, number[]>;
  /** The first record of each kind it received, for the bytes per hop. */
  sample: Map<RecordKind, WorkRecord>;
  measuring: boolean;
}

const mean = (v: number[]) => (v.length === 0 ? Number.NaN : v.reduce((a, b) => a + b, 0) / v.length);

/** The same batches for every job: windows of the byte-level tokens of this repository's README. */
function batches(count: number): TrainingBatch[] {
  const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  const tokens = Int32Array.from(tok.encode(readFileSync(new URL('../README.md', import.meta.url), 'utf8')));
  const rng = new Generator(3);
  return Array.from({ length: count }, () => textBatch(tokens, rng, ROWS, SEQ));
}

/** Counts every checked record, keeps one of each kind, and times each audit (without changing what either does). */
function instrument(job: Job): void {
  for (const stage of job.trainer.stages) {
    for (const handle of stage.replicas) {
      if (!(handle instanceof RedundantStage)) continue; // the user's own ends sign nothing
      for (const lane of handle.lanes) {
        const inner = lane.onRecord;
        lane.onRecord = (s, record) => {
          if (job.measuring) job.records++;
          // a middle section's backward names its input gradient; the first's names none (token ids)
          if (!job.sample.has(record.kind) && record.output !== '') job.sample.set(record.kind, record);
          inner?.(s, record);
        };
      }
    }
  }
  const verifier = job.dm.verifier!;
  const audit = verifier.audit.bind(verifier);
  verifier.audit = async (...args) => {
    const t0 = performance.now();
    const verdict = await audit(...args);
    if (job.measuring) {
      const kind = args[1].kind;
      const times = job.audits.get(kind) ?? [];
      times.push(performance.now() - t0);
      job.audits.set(kind, times);
    }
    return verdict;
  };
}

async function step(job: Job, batch: TrainingBatch): Promise<void> {
  const t0 = performance.now();
  const r = await job.trainer.step(batch);
  const wall = (performance.now() - t0) / 1000;
  if (!job.measuring) return;
  job.wall.push(wall);
  job.pipeline.push(r.seconds);
  job.losses.push(r.loss);
  if (r.verification.failed > 0 || r.verification.replayedSteps > 0) throw new Error(`${job.label}: an honest swarm failed a check`);
}

/**
 * Proof-of-learning verification overhead: training GPT-2 (4 blocks) across workers on
 * loopback (the default backend, onnxruntime, one thread; the user and workers in this
 * process, the validator in its own, real libp2p sockets; records are then checked within
 * ORT_TOLERANCE), with the validator re-running a sampled share p of the workers' signed
 * records while the next step computes, against the same job with p = 0 in the same run.
 * The jobs take their steps in turns (one step each, round after round) on the same batches,
 * so passing load touches them alike; a job's re-runs then have the other jobs' steps to
 * finish in, as they have a step's forwards and backwards when a job runs alone. Also redundancy 2 (every
 * section on two workers, results compared), and the bytes a record adds to one hop.
 */
export async function benchVerify(steps: number): Promise<Row[]> {
  setBackend('ort', { threads: 1, spinning: false });
  const config = gpt2Config({ vocabSize: 257, hidden: HIDDEN, layers: LAYERS, heads: 4, maxPositions: SEQ });
  const list = batches(WARMUP + steps);
  // the validator is its own process, as it is its own machine in a swarm: its re-runs use another core
  const validator = await launchNode(['validator', '--backend', 'ort', '--threads', '1', '--parent-pid', String(process.pid)], 60_000);
  const boot = validator.addrs[0];
  const workers: Worker[] = [];
  const start = () => startWorker({ bootstrap: boot, memoryBytes: 2 ** 30 });
  for (let i = 0; i < 3; i++) workers.push(await start());
  const user = await createNode();
  const jobs: Job[] = [];
  const open = async (label: string, sampleRate: number, redundancy: number) => {
    const dm = await distribute(user, boot, createModel(config, { seed: 5 }), {
      strategy: 'parameter-balanced', verify: { redundancy, sampleRate, seed: SEED },
    });
    const trainer = await dm.trainer({ optimizer: { lr: 1e-3 }, totalSteps: WARMUP + steps, microBatches: MICRO });
    const job: Job = {
      label, sampleRate, redundancy, dm, trainer, wall: [], pipeline: [], losses: [], records: 0, checkedBefore: 0,
      audits: new Map(), sample: new Map(), measuring: false,
    };
    instrument(job);
    jobs.push(job);
    return job;
  };
  try {
    for (const p of RATES) await open(`p = ${p}`, p, 1);
    // redundancy needs a fourth worker: two copies of a two-section plan
    workers.push(await start());
    await open('redundancy 2, p = 0', 0, 2);
    for (let s = 0; s < WARMUP; s++) for (const job of jobs) await step(job, list[s]);
    for (const job of jobs) {
      job.measuring = true;
      job.checkedBefore = job.trainer.verification.checked;
    }
    // each round starts with the next job: none always runs right after the slowest (redundancy 2)
    for (let s = WARMUP; s < WARMUP + steps; s++) {
      for (let j = 0; j < jobs.length; j++) await step(jobs[(s + j) % jobs.length], list[s]);
    }
    for (const job of jobs) job.measuring = false;
    return report(jobs, steps);
  } finally {
    await Promise.all(jobs.map((j) => j.dm.close().catch(() => {})));
    await user.stop();
    await Promise.all(workers.map((w) => w.stop()));
    validator.process.kill('SIGTERM');
  }
}

function report(jobs: Job[], steps: number): Row[] {
  const ref = jobs[0];
  const t0 = mean(ref.wall);
  const shape = `GPT-2 ${HIDDEN} wide, ${LAYERS} blocks, ${ROWS}×${SEQ} tokens, m = ${MICRO}`;
  const rows: Row[] = [{
    section: 'verify',
    case: `train step, 3 workers, p = 0, redundancy 1 (${shape}; mean of ${steps})`,
    value: t0,
    unit: 's',
    reference: 'itself',
    referenceValue: t0,
    ratio: 1,
  }];
  for (const job of jobs.slice(1)) {
    const t = mean(job.wall);
    const overhead = (100 * (t - t0)) / t0;
    const checked = job.trainer.verification.checked - job.checkedBefore;
    const label = job.redundancy === 1 ? `3 workers, ${job.label}` : `4 workers (2 sections × 2 copies), ${job.label}`;
    // the audits run after the pipeline's step: the wall time beyond it is theirs
    const auditSeconds = mean(job.wall.map((w, i) => w - job.pipeline[i]));
    const sameLosses = job.losses.every((l, i) => l === ref.losses[i]);
    if (!sameLosses) process.stderr.write(`verify: ${job.label} trained to other losses than p = 0: checking should not change the computation\n`);
    rows.push(
      { section: 'verify', case: `train step, ${label}`, value: t, unit: 's', reference: 'p = 0, same run', referenceValue: t0, ratio: t / t0 },
      {
        section: 'verify',
        case: `overhead share of job time, ${label}`,
        value: overhead,
        unit: '%',
        // redundancy k runs every computation k times: (k − 1)·100% of the workers' time on top
        ...(job.redundancy === 1
          ? { reference: 'target', referenceValue: TARGET_PERCENT, ratio: overhead / TARGET_PERCENT }
          : { reference: 'every computation twice', referenceValue: 100 * (job.redundancy - 1), ratio: overhead / (100 * (job.redundancy - 1)) }),
        ...(job.sampleRate === TARGET_RATE && job.redundancy === 1 ? { target: `≤ ${TARGET_PERCENT}% at p = ${TARGET_RATE}` } : {}),
      },
    );
    if (job.redundancy > 1) {
      const sections = job.trainer.stages.filter((st) => st.replicas[0] instanceof RedundantStage).length;
      const perStep = job.trainer.verification.compared / (WARMUP + steps);
      rows.push({
        section: 'verify',
        case: `results compared per step, ${label}`,
        value: perStep,
        unit: 'results',
        reference: `${2 * MICRO + 1} computations × ${sections} sections`,
        referenceValue: (2 * MICRO + 1) * sections,
        ratio: perStep / ((2 * MICRO + 1) * sections),
      });
      continue;
    }
    rows.push(
      {
        section: 'verify',
        case: `records re-executed in ${steps} steps, ${label}`,
        value: checked,
        unit: 'records',
        reference: `p × ${job.records} records signed`,
        referenceValue: job.sampleRate * job.records,
        ratio: checked / (job.sampleRate * job.records),
      },
      {
        section: 'verify',
        case: `pipeline time per step (keeping each step's state; waiting for the last step's re-runs before the flush), ${label}`,
        value: mean(job.pipeline),
        unit: 's',
        reference: 'p = 0, same run',
        referenceValue: mean(ref.pipeline),
        ratio: mean(job.pipeline) / mean(ref.pipeline),
      },
      {
        section: 'verify',
        case: `time per step outside the pipeline (starting the re-runs), ${label}`,
        value: 1000 * auditSeconds,
        unit: 'ms',
        reference: 'step at p = 0',
        referenceValue: 1000 * t0,
        ratio: auditSeconds / t0,
      },
    );
  }
  // the time of one audit (request to verdict: the validator fetches the bundle from the worker and re-runs it), by kind
  const audits = new Map<RecordKind, number[]>();
  for (const job of jobs) for (const [kind, ms] of job.audits) audits.set(kind, [...(audits.get(kind) ?? []), ...ms]);
  for (const [kind, ms] of audits) {
    rows.push({
      section: 'verify',
      case: `one audit of a ${kind} record (fetch + re-execute; ${ms.length} audits)`,
      value: mean(ms),
      unit: 'ms',
      reference: 'step at p = 0',
      referenceValue: 1000 * t0,
      ratio: mean(ms) / (1000 * t0),
    });
  }
  rows.push(...recordBytes(ref));
  return rows;
}

/** The bytes a record adds to a hop: its control frame, sent just before the tensor, against that tensor's frame. */
function recordBytes(job: Job): Row[] {
  const rows = ROWS / MICRO;
  const activation = encodeTensor(toWire(tensor(new Float32Array(rows * SEQ * HIDDEN), [rows, SEQ, HIDDEN]), 1_000_000));
  const hop = activation.reduce((a, b) => a + b.length, 0);
  return (['forward', 'backward', 'step'] as const).flatMap((kind) => {
    const record = job.sample.get(kind);
    if (!record) return [];
    // a request id of seven digits: more than any job sends
    const bytes = encodeControl({ type: 'record', id: 1_000_000, record }).length;
    return [{
      section: 'verify',
      case: `record frame of a ${kind}${kind === 'step' ? ' (inside its control answer)' : ''}, bytes per hop (${((100 * bytes) / hop).toFixed(2)}% of it)`,
      value: bytes,
      unit: 'B',
      reference: `activation frame of one hop ([${rows}, ${SEQ}, ${HIDDEN}] float32)`,
      referenceValue: hop,
      ratio: bytes / hop,
    }];
  });
}
