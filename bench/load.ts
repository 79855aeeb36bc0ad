import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type LocalSwarm, localSwarm } from '../src/swarm/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, type GPT2Config, HFTokenizer, partBytes, saveModel } from '../src/models/index.ts';
import { parseStatsAnswer, request } from '../src/p2p/index.ts';
import type { Row } from './gemm.ts';
import type { LoadUserResult } from './load-user.ts';

/** A case that takes longer is stopped and reported as failed (a load that hangs must not hang the bench). */
const CASE_TIMEOUT_MS = 120_000;
/** Prompt of the first token: a few byte tokens. */
const PROMPT = [72, 101, 108, 108, 111, 44, 32, 119];
const MB = 1e6;
/** Runs of the local reference (a few seconds each, process start included). */
const LOCAL_RUNS = 3;

const log = (s: string) => process.stderr.write(`  load: ${s}\n`);

/** How the workers of a case got the weights: nothing held, chunks on their disks from the load before, or the checkpoint itself. */
type Holding = 'cold' | 'warm' | 'models';

const HOLDING_LABEL: Record<Holding, string> = {
  cold: 'cold',
  warm: 'warm',
  models: 'cold, workers hold the checkpoint (--models)',
};

/** The reference when every local run failed. */
const NO_REFERENCE: LoadUserResult = {
  ttftSeconds: Number.NaN, loadSeconds: Number.NaN, bytesSent: 0, maxRssBytes: Number.NaN, baselineRssBytes: Number.NaN,
};

interface Measured extends LoadUserResult {
  /** Weight bytes the workers received over the network, and found in their own store or checkpoints, during the case. */
  received: number;
  reused: number;
}

/**
 * Runs the user's side of one case in its own process (bench/load-user.ts), so that its peak
 * resident set is the user's alone, and reads the JSON line it prints.
 */
function runUser(args: string[]): Promise<LoadUserResult> {
  const script = fileURLToPath(new URL('./load-user.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', import.meta.resolve('tsx'), script, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`timed out after ${CASE_TIMEOUT_MS / 1000} s; stderr: ${err.trim().slice(-2000)}`));
    }, CASE_TIMEOUT_MS);
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      const line = out.trim().split('\n').pop() ?? '';
      try {
        if (code !== 0) throw new Error(`exited (${code ?? signal})`);
        const r = JSON.parse(line) as Record<string, unknown>;
        const keys = ['ttftSeconds', 'loadSeconds', 'bytesSent', 'maxRssBytes', 'baselineRssBytes'] as const;
        for (const k of keys) if (typeof r[k] !== 'number' || !Number.isFinite(r[k])) throw new Error(`no number ${k} in '${line}'`);
        resolve(r as unknown as LoadUserResult);
      } catch (e) {
        reject(new Error(`${(e as Error).message}; stderr: ${err.trim().slice(-2000)}`));
      }
    });
  });
}

/** Weight bytes the swarm's workers have received and reused so far (their `stats` answers, summed). */
async function workerWeights(swarm: LocalSwarm): Promise<{ received: number; reused: number }> {
  const stats = await Promise.all(
    swarm.workers.map(async (w) => parseStatsAnswer(await request(swarm.user.node, { peerId: w.peerId, addrs: w.addrs }, { type: 'stats' }))),
  );
  return {
    received: stats.reduce((sum, s) => sum + s.work.weightBytesReceived, 0),
    reused: stats.reduce((sum, s) => sum + s.work.weightBytesReused, 0),
  };
}

/** One distributed case on `swarm`: the user's process, and what the workers took in meanwhile. */
async function distributedCase(swarm: LocalSwarm, dir: string, cacheDir: string): Promise<Measured> {
  const before = await workerWeights(swarm);
  const user = await runUser(['--dir', dir, '--prompt', PROMPT.join(','), '--bootstrap', swarm.bootstrap, '--cache-dir', cacheDir]);
  const after = await workerWeights(swarm);
  return { ...user, received: after.received - before.received, reused: after.reused - before.reused };
}

/**
 * Starts a swarm of `workers` (holding the checkpoint when `runs` is ['models']) and runs the
 * cases `runs` on it one after the other, with one hash cache for the user; a failed case ends
 * the swarm's runs (a warm run needs a cold one that finished).
 */
async function onSwarm(workers: number, runs: Holding[], dir: string, cacheDir: string): Promise<[Holding, Measured | Error][]> {
  const label = `${workers} worker${workers > 1 ? 's' : ''}`;
  const cases: [Holding, Measured | Error][] = [];
  let swarm: LocalSwarm;
  try {
    log(`${label}: starting the swarm${runs.includes('models') ? ' (the workers index the checkpoint)' : ''} ...`);
    swarm = await localSwarm({ workers, handleSignals: false, ...(runs.includes('models') ? { models: dir } : {}) });
  } catch (err) {
    log(`${label}: the swarm did not start: ${(err as Error).message}`);
    return [[runs[0], err as Error]];
  }
  try {
    for (const h of runs) {
      log(`${label}, ${h} ...`);
      try {
        const m = await distributedCase(swarm, dir, cacheDir);
        const moved = `workers received ${(m.received / MB).toFixed(0)} MB, reused ${(m.reused / MB).toFixed(0)} MB`;
        log(`${label}, ${h}: first token ${m.ttftSeconds.toFixed(2)} s, ${moved}`);
        cases.push([h, m]);
      } catch (err) {
        log(`${label}, ${h}: FAILED: ${(err as Error).message}`);
        cases.push([h, err as Error]);
        break;
      }
    }
  } finally {
    await swarm.close();
  }
  return cases;
}

/** Writes a randomly initialised model of `config` with a byte-level tokenizer to `dir`; returns its weight bytes. */
async function writeModel(config: GPT2Config, dir: string): Promise<number> {
  const model = createModel(config, { seed: 0 });
  model.tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  await saveModel(model, dir);
  return 4 * model.numParameters();
}

/**
 * Loading a GPT-2-shaped checkpoint (341 MB of float32 weights; --quick: 102 MB and 1, 2
 * workers) onto 1, 2 and 3 workers (each its own process on loopback), against loading it in
 * one process (loadModel and the first token), measured in the same run: time to the first
 * token, load throughput, the user's peak resident set, and the weight bytes the workers
 * received. Cold: a fresh swarm whose workers hold nothing, and a fresh hash cache for the
 * user; warm: a second load on the same swarm (the chunks are on the workers' disks, the
 * hashes in the user's cache); --models: a fresh swarm whose workers indexed the checkpoint
 * before they announced themselves (not timed). The user's side runs in a child process per
 * case (bench/load-user.ts). The checkpoint was just written: every case reads the page cache.
 */
export async function benchLoad(quick: boolean): Promise<Row[]> {
  const config = quick
    ? gpt2Config({ vocabSize: 257, hidden: 512, layers: 8, heads: 8, maxPositions: 128, bosTokenId: 256, eosTokenId: 256 })
    : gpt2Config({ vocabSize: 257, hidden: 768, layers: 12, heads: 12, maxPositions: 128, bosTokenId: 256, eosTokenId: 256 });
  const workerCounts = quick ? [1, 2] : [1, 2, 3];
  const root = mkdtempSync(join(tmpdir(), 'tensorlink-bench-load-'));
  const dir = join(root, 'model');
  const rows: Row[] = [];
  try {
    const t = performance.now();
    const modelBytes = await writeModel(config, dir);
    // the user keeps the ends (embedding, final norm, head): the workers' sections are the rest
    const sizes = { model: modelBytes, sections: modelBytes - partBytes(config, 'ends') };
    const model = `GPT-2 ${(modelBytes / MB).toFixed(0)} MB (${config.hidden} wide, ${config.layers} blocks)`;
    log(`wrote ${model} in ${((performance.now() - t) / 1000).toFixed(1)} s`);

    // the reference is cheap: the median of a few runs (by time to first token) steadies it on a shared machine
    const locals: LoadUserResult[] = [];
    for (let i = 0; i < LOCAL_RUNS; i++) {
      log(`local ${i + 1}/${LOCAL_RUNS}: loadModel + first token in one process ...`);
      try {
        const r = await runUser(['--dir', dir, '--prompt', PROMPT.join(',')]);
        log(`local ${i + 1}/${LOCAL_RUNS}: first token ${r.ttftSeconds.toFixed(2)} s, peak RSS ${(r.maxRssBytes / MB).toFixed(0)} MB`);
        locals.push(r);
      } catch (err) {
        log(`local ${i + 1}/${LOCAL_RUNS}: FAILED: ${(err as Error).message}`);
      }
    }
    // no reference at all: the distributed figures are still reported, against NaN
    const local = [...locals].sort((a, b) => a.ttftSeconds - b.ttftSeconds)[Math.floor(locals.length / 2)] ?? NO_REFERENCE;

    for (const workers of workerCounts) {
      const label = `${workers} worker${workers > 1 ? 's' : ''}`;
      // cold then warm on one swarm; the workers holding the checkpoint on a fresh one
      const swarms: Holding[][] = quick ? [['cold', 'warm']] : [['cold', 'warm'], ['models']];
      for (const runs of swarms) {
        const cases = await onSwarm(workers, runs, dir, mkdtempSync(join(root, 'cache-')));
        for (const [h, m] of cases) rows.push(...caseRows(`${label}, ${HOLDING_LABEL[h]}`, h, m, local, sizes, model));
      }
    }
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
  return rows;
}

/** The rows of one case against local loading (NaN and the error in the label when it failed). */
function caseRows(
  label: string,
  holding: Holding,
  m: Measured | Error,
  local: LoadUserResult,
  sizes: { model: number; sections: number },
  model: string,
): Row[] {
  const modelBytes = sizes.model;
  // the first clause of the error in the table; all of it (the child's stderr too) went to stderr
  const failed = m instanceof Error ? ` (failed: ${m.message.split(/\n|; stderr/)[0].slice(0, 160)})` : '';
  const r = m instanceof Error ? null : m;
  const ttft = r?.ttftSeconds ?? Number.NaN;
  const rate = r ? modelBytes / MB / r.loadSeconds : Number.NaN;
  const localRate = modelBytes / MB / local.loadSeconds;
  const peak = r ? r.maxRssBytes / MB : Number.NaN;
  const above = r ? (r.maxRssBytes - r.baselineRssBytes) / MB : Number.NaN;
  const localAbove = (local.maxRssBytes - local.baselineRssBytes) / MB;
  const received = r ? r.received / MB : Number.NaN;
  const base = { section: 'load' };
  return [
    {
      ...base,
      case: `time to first token, ${model}, ${label}${failed}`,
      value: ttft,
      unit: 's',
      reference: 'loadModel + 1 token in one process',
      referenceValue: local.ttftSeconds,
      ratio: ttft / local.ttftSeconds,
    },
    {
      ...base,
      case: `load throughput, ${label}`,
      value: rate,
      unit: 'MB/s',
      reference: 'loadModel in one process',
      referenceValue: localRate,
      ratio: rate / localRate,
    },
    {
      ...base,
      case: `user peak RSS, ${label}`,
      value: peak,
      unit: 'MB',
      reference: 'local loading',
      referenceValue: local.maxRssBytes / MB,
      ratio: peak / (local.maxRssBytes / MB),
    },
    {
      ...base,
      case: `user peak RSS above its baseline, ${label}`,
      value: above,
      unit: 'MB',
      reference: 'local loading',
      referenceValue: localAbove,
      ratio: above / localAbove,
    },
    {
      ...base,
      case: `weights received by the workers, ${label}`,
      value: received,
      unit: 'MB',
      reference: 'the sections\' weights',
      referenceValue: sizes.sections / MB,
      ratio: received / (sizes.sections / MB),
      target: holding === 'cold' ? '1' : '0',
    },
  ];
}
