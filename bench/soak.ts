/**
 * `npm run bench -- --only soak` (opt-in, not in CI): memory that stays bounded over time. A host (its own process)
 * serves 500 sessions opened and closed over 10 minutes, 50 a round, by users in this process; and, over the same 10
 * minutes, a worker (its own process) runs 50 training jobs one after another, each loaded, trained a few steps and
 * closed. Each process's resident memory after every round is read from /proc; the figure is the last round's against
 * the first's (target: within 10%). `--quick`: 100 sessions over 2 minutes and 10 jobs.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { multiaddr } from '@multiformats/multiaddr';
import { additionTask, taskBatch } from '../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer, llamaConfig, loadModel, saveModel } from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { Generator, setBackend } from '../src/tensor/index.ts';
import { distribute, HostedModel } from '../src/user/index.ts';
import { alive, rss, type Running, startNode, waitFor } from '../test/helpers/processes.ts';
import type { Row } from './gemm.ts';

const mib = (b: number) => `${(b / 2 ** 20).toFixed(0)} MiB`;
/** Waits until a time (now if it has passed). */
const until = (at: number) => new Promise((res) => setTimeout(res, Math.max(0, at - Date.now())));

export async function benchSoak(quick: boolean, log: (s: string) => void): Promise<Row[]> {
  setBackend('js');
  const rounds = quick ? 2 : 10;
  const perRound = 50;
  const roundMs = 60_000;
  const jobs = quick ? 10 : 50;
  const dir = mkdtempSync(join(tmpdir(), 'tl-soak-'));
  const running: Running[] = [];
  const rows: Row[] = [];
  const node = await createNode();
  try {
    const config = llamaConfig({ vocabSize: 256, hidden: 64, layers: 4, heads: 4, kvHeads: 2, intermediate: 172, maxPositions: 128 });
    await saveModel(createModel(config, { seed: 1 }), join(dir, 'soak'));
    const validator = await startNode(['validator', '--backend', 'js']);
    running.push(validator);
    const boot = validator.addrs[0];
    const host = await startNode(['worker', '--bootstrap', boot, '--backend', 'js', '--memory', '1GiB', '--host', `soak=${join(dir, 'soak')}`]);
    running.push(host);
    const worker = await startNode(['worker', '--bootstrap', boot, '--backend', 'js', '--memory', '1GiB']);
    running.push(worker);
    const ends = await loadModel(join(dir, 'soak'), { part: 'ends' });
    const at = multiaddr(boot);
    await waitFor('the hosted model in the index', async () => {
      const m = await HostedModel.open(node, at, 'soak', { ends, verify: { sampleRate: 0 } });
      await m.close();
      return true;
    }, 30_000);

    // the host's sessions and the worker's jobs run side by side over the same minutes: neither process sits idle
    // before its first round (an idle node's heap is shrunk by V8, which would make the first round's figure a low one)
    const began = Date.now();
    const spanMs = rounds * roundMs;

    // sessions: each its own HostedModel (its own route and stage streams), opened, a few tokens, closed; five at once
    const serve = async () => {
      const hostRss: number[] = [];
      let sessions = 0;
      for (let r = 0; r < rounds; r++) {
        for (let i = 0; i < perRound; i += 5) {
          await Promise.all(Array.from({ length: 5 }, async (_, k) => {
            const m = await HostedModel.open(node, at, 'soak', { ends, verify: { sampleRate: 0 } });
            try {
              const prompt = Array.from({ length: 6 + ((i + k) % 7) }, (_, j) => (13 * (i + k) + 7 * j) % 256);
              await m.generate(prompt, { maxNewTokens: 8, temperature: 0, stopTokens: [] });
            } finally {
              await m.close();
            }
          }));
          sessions += 5;
          await until(began + ((r * perRound + i + 5) / (rounds * perRound)) * spanMs);
        }
        if (!alive(host.child)) throw new Error('soak: the host died');
        hostRss.push(rss(host.child.pid!));
        log(`  soak: host after ${sessions} sessions: RSS ${mib(hostRss.at(-1)!)}`);
      }
      rows.push({
        section: 'soak', case: `host: RSS after ${sessions} sessions over ${rounds} min`, value: hostRss.at(-1)! / 2 ** 20, unit: 'MiB',
        reference: `after the first ${perRound}`, referenceValue: hostRss[0] / 2 ** 20, ratio: hostRss.at(-1)! / hostRss[0], target: '≤ 1.10',
      });
    };

    // jobs: a small GPT-2 trained 4 steps on the worker (the user keeps the ends), closed, 50 times over the same minutes
    const train = async () => {
      const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, maxPositions: 32 });
      const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
      const workerRss: number[] = [];
      for (let j = 0; j < jobs; j++) {
        const dm = await distribute(node, boot, createModel(config, { seed: 5 + j }), { strategy: 'parameter-balanced', training: true, verify: { sampleRate: 0 } });
        try {
          const trainer = await dm.trainer({ optimizer: { lr: 3e-3 }, totalSteps: 4, microBatches: 2 });
          const task = additionTask({ seed: j });
          const rng = new Generator(j);
          for (let s = 0; s < 4; s++) await trainer.step(taskBatch(task, tok, rng, 8, 256));
        } finally {
          await dm.close();
        }
        if (!alive(worker.child)) throw new Error('soak: the worker died');
        if ((j + 1) % Math.max(1, jobs / 10) === 0) {
          workerRss.push(rss(worker.child.pid!));
          log(`  soak: worker after ${j + 1} jobs: RSS ${mib(workerRss.at(-1)!)}`);
        }
        await until(began + ((j + 1) / jobs) * spanMs);
      }
      rows.push({
        section: 'soak', case: `worker: RSS after ${jobs} training jobs over ${rounds} min`, value: workerRss.at(-1)! / 2 ** 20, unit: 'MiB',
        reference: `after the first ${jobs / 10}`, referenceValue: workerRss[0] / 2 ** 20, ratio: workerRss.at(-1)! / workerRss[0], target: '≤ 1.10',
      });
    };
    await Promise.all([serve(), train()]);
  } finally {
    for (const r of running) if (alive(r.child)) r.child.kill('SIGKILL');
    await node.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  return rows;
}
