import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createModel, llamaConfig, loadModel, saveModel } from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { launchNode } from '../src/swarm/index.ts';
import { setBackend } from '../src/tensor/index.ts';
import { HostedModel, type HostedVerify } from '../src/user/index.ts';
import { stepsToCatch } from '../src/verify/index.ts';
import { parseHostSpec, startWorker, type Worker } from '../src/worker/index.ts';
import type { Row } from './gemm.ts';

const ROWS = 4;
const PROMPT = 16;
const TARGET_PERCENT = 2;
const log = (s: string) => process.stderr.write(`  verify-hosted: ${s}\n`);

/** One way of checking the hosts, and what its sessions measured. */
interface Mode {
  label: string;
  verify: HostedVerify;
  model: HostedModel;
  wall: number[];
  /** The validator's CPU seconds during this mode's sessions. */
  validatorCpu: number;
}

/** User + system CPU seconds of a process, from /proc (Linux). */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (100 Hz)
}

const mean = (v: number[]) => v.reduce((a, b) => a + b, 0) / v.length;

/**
 * The cost of checking hosted inference: a hosted Llama (6 blocks × 256) on three in-process hosts (onnxruntime, one
 * thread), the validator its own process (its own core, as its own machine). Sessions of 4 rows × `positions` (128: 4
 * chunks per row and host) taken in turns by: no checks; commitments made by the hosts but none checked (what the
 * hosts pay, and all a session waits for where the validator has a machine of its own, as here it has not: it shares
 * the two cores with the hosts); activation commitments at the default chunk rate (0.37: a
 * host cheating on every chunk is caught within 10 with 99%) and at 1 (every chunk); and today's re-execution at its
 * default rate (0.05 of steps, each re-run step by step with the weights fetched). The figure: the session's wall time
 * over the unchecked one's (the user waits for its checks before the hosts drop the session), and the validator's CPU
 * seconds per session against the session's.
 */
export async function benchVerifyHosted(rounds: number, positions = 128): Promise<Row[]> {
  // 16 + NEW − 1 positions: 4 chunks per row and host at 128
  const NEW = positions - PROMPT + 1;
  setBackend('ort', { threads: 1, spinning: false });
  const dir = mkdtempSync(join(tmpdir(), 'tl-bench-verify-hosted-'));
  const maxPositions = Math.max(256, positions + 1);
  const config = llamaConfig({ vocabSize: 256, hidden: 256, layers: 6, heads: 8, kvHeads: 4, intermediate: 688, maxPositions });
  await saveModel(createModel(config, { seed: 1 }), join(dir, 'bench'));
  const validator = await launchNode(['validator', '--backend', 'ort', '--threads', '1', '--parent-pid', String(process.pid)], 60_000);
  const boot = validator.addrs[0];
  const hosts: Worker[] = [];
  const node = await createNode();
  const modes: Mode[] = [];
  try {
    const host = (span: string) => startWorker({ bootstrap: boot, host: [parseHostSpec(`bench=${join(dir, 'bench')}:${span}`)] });
    for (const span of ['0-1', '2-3', '4-5']) hosts.push(await host(span));
    const ends = await loadModel(join(dir, 'bench'), { part: 'ends' });
    const open = async (label: string, verify: HostedVerify) => {
      modes.push({ label, verify, model: await HostedModel.open(node, boot, 'bench', { ends, verify }), wall: [], validatorCpu: 0 });
    };
    await open('no checks', { sampleRate: 0 });
    // hosts commit to every chunk whatever the rate: at 0 the session pays for the commitments alone, which is all a
    // validator on a machine of its own adds (besides the wait for the last chunk's check)
    await open('commitments made, none checked', { mode: 'commit', sampleRate: 0 });
    await open('commitments, chunk rate 0.37', { mode: 'commit', sampleRate: 0.37 });
    await open('commitments, every chunk', { mode: 'commit', sampleRate: 1 });
    await open('re-execution, step rate 0.05', { mode: 'reexec', sampleRate: 0.05 });
    const prompt = (r: number, i: number) => Array.from({ length: PROMPT }, (_, k) => (17 * i + 31 * k + 7 * r) % 256);
    const prompts = (r: number) => Array.from({ length: ROWS }, (_, i) => prompt(r, i));
    const options = { maxNewTokens: NEW, temperature: 0, stopTokens: [] };
    // warm: every mode once (the validator fetches each span's weights for its first check)
    for (const m of modes) await m.model.generateBatch(prompts(0), options);
    for (let r = 1; r <= rounds; r++) {
      for (let j = 0; j < modes.length; j++) {
        const m = modes[(r + j) % modes.length];
        const cpu0 = cpuSeconds(validator.process.pid!);
        const t = performance.now();
        await m.model.generateBatch(prompts(r), options);
        m.wall.push((performance.now() - t) / 1000);
        m.validatorCpu += cpuSeconds(validator.process.pid!) - cpu0;
      }
      log(`round ${r}: ${modes.map((m) => `${m.label} ${m.wall.at(-1)!.toFixed(2)} s`).join(', ')}`);
    }
    for (const m of modes) if (m.model.verification.failed > 0) throw new Error(`${m.label}: an honest host failed a check`);
    return report(modes, rounds, positions);
  } finally {
    await Promise.all(modes.map((m) => m.model.close().catch(() => {})));
    await node.stop();
    await Promise.all(hosts.map((h) => h.stop()));
    validator.process.kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  }
}

function report(modes: Mode[], rounds: number, positions: number): Row[] {
  const [none] = modes;
  const t0 = mean(none.wall);
  const shape = `Llama 6 × 256 on 3 hosts, ${ROWS} rows × ${positions} positions; mean of ${rounds}`;
  const rows: Row[] = [{
    section: 'verify', case: `hosted session, no checks (${shape})`, value: t0, unit: 's', reference: 'itself', referenceValue: t0, ratio: 1,
  }];
  for (const m of modes.slice(1)) {
    const t = mean(m.wall);
    const overhead = (100 * (t - t0)) / t0;
    const commit = m.verify.mode === 'commit';
    const catching = commit && m.verify.sampleRate === 0.37;
    const hostsOnly = commit && m.verify.sampleRate === 0;
    rows.push(
      { section: 'verify', case: `hosted session, ${m.label}`, value: t, unit: 's', reference: 'no checks, same run', referenceValue: t0, ratio: t / t0 },
      {
        section: 'verify', case: `overhead share of session time, ${m.label}`, value: overhead, unit: '%', reference: 'target',
        referenceValue: TARGET_PERCENT, ratio: overhead / TARGET_PERCENT,
        ...(catching ? { target: `≤ ${TARGET_PERCENT}% at a rate that catches a host cheating on every chunk within ${stepsToCatch(0.37, 1, 0.99)} chunks (99%)` } : {}),
        ...(hostsOnly ? { target: `≤ ${TARGET_PERCENT}%: the hosts' share, the whole cost where the validator has a machine of its own` } : {}),
      },
      {
        section: 'verify', case: `validator CPU per session, ${m.label} (${commit ? `${m.model.verification.chunks} chunks` : `${m.model.verification.checked} steps`} checked in all)`,
        value: m.validatorCpu / rounds, unit: 's', reference: 'session wall, no checks', referenceValue: t0, ratio: m.validatorCpu / rounds / t0,
      },
    );
  }
  return rows;
}
