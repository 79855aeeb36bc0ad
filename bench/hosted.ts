import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createModel, llamaConfig, loadModel, saveModel } from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { setBackend } from '../src/tensor/index.ts';
import { HostedModel } from '../src/user/index.ts';
import { startValidator } from '../src/validator/index.ts';
import { parseHostSpec, startWorker } from '../src/worker/index.ts';
import type { Row } from './gemm.ts';

const NEW_TOKENS = 24;
const USERS = [1, 4, 8];
const log = (s: string) => process.stderr.write(`  hosted: ${s}\n`);

/**
 * A hosted Llama (8 blocks × 256, byte vocabulary) on two in-process hosts (4 blocks each), used by 1, 4 and 8 users
 * at once: each user its own session (a host runs the one-token steps of sessions waiting at once as one batch:
 * continuous batching, src/worker/decode-batcher.ts), and the same users' prompts batched into one session by a
 * gateway, as `serve --model NAME` does. The figure is the total tokens per second against one user alone.
 */
export async function benchHosted(backend: 'js' | 'ort' = 'ort'): Promise<Row[]> {
  setBackend(backend);
  const dir = mkdtempSync(join(tmpdir(), 'tl-bench-hosted-'));
  const rows: Row[] = [];
  const config = llamaConfig({ vocabSize: 256, hidden: 256, layers: 8, heads: 8, kvHeads: 4, intermediate: 688, maxPositions: 256 });
  await saveModel(createModel(config, { seed: 1 }), join(dir, 'bench'));
  const validator = await startValidator();
  const boot = validator.node.getMultiaddrs()[0].toString();
  const hosts = [
    await startWorker({ bootstrap: boot, host: [parseHostSpec(`bench=${join(dir, 'bench')}:0-3`)] }),
    await startWorker({ bootstrap: boot, host: [parseHostSpec(`bench=${join(dir, 'bench')}:4-7`)] }),
  ];
  const ends = await loadModel(join(dir, 'bench'), { part: 'ends' });
  // the users share one node here (a node per user would only be refused by libp2p's limit on new connections from
  // one address per second): each has its own session, as users on their own machines would
  const node = await createNode();
  try {
    const models: HostedModel[] = [];
    // serving alone is measured: no step is re-run by the validator (its re-runs at the end of a session are checks' cost)
    const at = validator.node.getMultiaddrs()[0];
    for (let i = 0; i < Math.max(...USERS); i++) models.push(await HostedModel.open(node, at, 'bench', { ends, verify: { sampleRate: 0 } }));
    const prompt = (i: number) => Array.from({ length: 8 + (i % 5) }, (_, k) => (17 * i + 31 * k) % 256);
    const options = { maxNewTokens: NEW_TOKENS, temperature: 0, stopTokens: [] };
    await models[0].generate(prompt(0), options); // warm
    const best = async (run: () => Promise<number>) => Math.max(await run(), await run());
    const alone = await best(async () => {
      const t = performance.now();
      const { tokens } = await models[0].generate(prompt(0), options);
      return tokens.length / ((performance.now() - t) / 1000);
    });
    log(`1 user: ${alone.toFixed(1)} tok/s`);
    for (const n of USERS.filter((u) => u > 1)) {
      const counted = () => hosts.map((h) => h.stages.work())
        .reduce((s, w) => ({ steps: s.steps + w.forwards, batched: s.batched + w.batchedRows }), { steps: 0, batched: 0 });
      const before = counted();
      const sessions = await best(async () => {
        const t = performance.now();
        const outs = await Promise.all(models.slice(0, n).map((m, i) => m.generate(prompt(i), options)));
        return outs.reduce((s, o) => s + o.tokens.length, 0) / ((performance.now() - t) / 1000);
      });
      const gateway = await best(async () => {
        const t = performance.now();
        const outs = await models[0].generateBatch(Array.from({ length: n }, (_, i) => prompt(i)), options);
        return outs.reduce((s, o) => s + o.length, 0) / ((performance.now() - t) / 1000);
      });
      const after = counted();
      const share = (after.batched - before.batched) / Math.max(1, after.steps - before.steps);
      log(`${n} users: ${sessions.toFixed(1)} tok/s in ${n} sessions (${(100 * share).toFixed(0)}% of the hosts' steps batched across sessions), `
        + `${gateway.toFixed(1)} tok/s batched at a gateway`);
      const row = (c: string, v: number, target?: string): Row => ({
        section: 'hosted', case: c, value: v, unit: 'tok/s', reference: '1 user alone', referenceValue: alone, ratio: v / alone, ...(target ? { target } : {}),
      });
      rows.push(row(`${n} users at once, a session each (total)`, sessions));
      rows.push(row(`${n} users batched at a gateway (serve --model NAME; total)`, gateway, '> 1: batching raises the total'));
    }
    await Promise.all(models.map((m) => m.close()));
  } finally {
    await node.stop();
    await Promise.all(hosts.map((h) => h.stop()));
    await validator.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  return rows;
}
